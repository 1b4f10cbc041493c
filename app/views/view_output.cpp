// Output view: what compressing the cache does to the model's text (engine/model/generate.h,
// docs/generate.md). Runs a llama2.c model (a bundled one or any checkpoint) on a prompt,
// compresses every layer's cache at position N with each chosen method and ratio, and shows a
// table of top-1 agreement / KL / perplexity by method and ratio, the KL per step, and the exact
// and compressed continuations side by side with the diverging tokens marked.
#include <imgui.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "app/app_state.h"
#include "app/colormap.h"
#include "app/method_list.h"
#include "app/new_capture_dialog.h"
#include "app/plot.h"
#include "app/ui_layout.h"
#include "app/views/view.h"
#include "app/views/view_jobs.h"
#include "engine/core/error.h"
#include "engine/core/printable.h"
#include "engine/io/json_fields.h"
#include "engine/model/generate.h"
#include "engine/model/llama2c.h"

namespace kvscope::app {
namespace {

// The Output view's derived result (AppState::results): the generation the user asked for.
constexpr const char* kOutputResult = "output.generate";
// The protocol's ratios, and 0.75 so that kvpress's four (keep 0.75, 1/2, 1/4, 1/8: it counts
// the fraction removed, 0.25 ... 0.875) are all offered.
constexpr double kRatios[] = {0.5, 0.25, 0.125, 0.0625, 0.75};

// What the user asked to generate (the controls as they were at Run, or the defaults of the
// open capture's model and prompt): the job's input (JobPlan::derive), so a change of capture
// (new defaults) or a Run with other controls outdates the shown report and marks it stale. The
// continuation is part of it only when it is used (output_input).
struct OutputRequest {
  std::string checkpoint, tokenizer, prompt, continuation;
  bool has_continuation = false;
  int compress_at = 0, steps = 0, recompress_every = 0, seed = 0;
  std::vector<std::string> methods;
  std::vector<double> ratios;
  bool operator==(const OutputRequest&) const = default;
};
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(OutputRequest, checkpoint, tokenizer, prompt, continuation,
                                   has_continuation, compress_at, steps, recompress_every, seed,
                                   methods, ratios)

// The request as the job reads it: an unused continuation is left out.
OutputRequest output_input(OutputRequest rq) {
  if (!rq.has_continuation) rq.continuation.clear();
  return rq;
}

std::shared_ptr<const GenerateReport> run_output(const OutputRequest& rq, const NoHandles&,
                                                 JobContext& ctx, const JobPlan::PartialFn&) {
  GenerateSpec spec;
  spec.prompt = rq.prompt;
  spec.compress_at = rq.compress_at;
  spec.steps = rq.steps;
  spec.recompress_every = rq.recompress_every;
  spec.seed = static_cast<uint64_t>(rq.seed);
  spec.threads = 0;
  spec.ratios = rq.ratios;
  for (const std::string& name : rq.methods)
    if (const Method* m = find_method(name)) spec.methods.push_back(m);
  spec.has_continuation = rq.has_continuation;
  spec.continuation = rq.continuation;
  llama2c::Transformer model(rq.checkpoint);
  llama2c::Tokenizer tok(rq.tokenizer, model.config().vocab_size);
  return std::make_shared<const GenerateReport>(run_generate(
      model, tok, spec,
      [&](long long done, long long total) {
        ctx.progress(static_cast<int>(done), static_cast<int>(total));
      },
      ctx.cancel_flag()));
}

class OutputView final : public View {
 public:
  OutputView() : methods_(default_methods().output) {
    ratio_on_[1] = true;  // 1/4
  }
  const char* name() const override { return "output"; }
  const char* title() const override { return "Output"; }
  const char* help() const override {
    return "What compression does to the text: a llama2.c model continues a prompt with each "
           "method's compressed cache; top-1 agreement, KL per step and perplexity against the "
           "exact cache, and the exact and compressed continuations side by side with diverging "
           "tokens marked.";
  }

  bool ready(const AppState& s) const override {
    // Without any model to run (no models folder) there is nothing to wait for.
    const Result& r = s.result(kOutputResult);
    return (r.fresh() && !r.busy()) || checkpoint_[0] == '\0';
  }

  // The generation the user asked for, run by AppState::reconcile() (and cancelled by it when
  // the request changes or the view is hidden).
  void plan(const AppState& s, std::vector<NamedPlan>& out) const override {
    JobPlan p;
    if (requested_) {
      p.derive("output", output_input(*requested_), NoHandles{}, &run_output);
      p.lane = Lane::Analysis;
      p.label = "Output: generate";
      p.auto_limit_s = 1e30;  // asked for by a Run click or by opening the view
    }
    out.emplace_back(kOutputResult, p);
  }

  static std::string result_key(const OutputRequest& rq) {
    return JobPlan::derived_key("output", output_input(rq));
  }
  // The shown report answers the current request. Checked against the request itself, not only
  // the result's `want`: a change of capture makes a new request while drawing, and a report
  // exported in that frame must not pass for the new capture's.
  bool current(const AppState& s) const {
    const Result& r = s.result(kOutputResult);
    return requested_ && r.fresh() && r.key == result_key(*requested_);
  }

  void draw(AppState& s) override {
    init_from_capture(s);
    if (!presenting_view()) {  // a presentation shows the results alone
      draw_controls(s);
      ImGui::Separator();
    }
    mark_figure_top();  // figure exports: the results, not the controls above
    const Result& res = s.result(kOutputResult);
    if (!res.error.empty() && res.key == res.want) {
      ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.45f, 0.4f, 1.0f));
      ImGui::TextWrapped("%s", res.error.c_str());
      ImGui::PopStyleColor();
    }
    const std::shared_ptr<const GenerateReport> rep = res.ptr<GenerateReport>();
    if (!rep) {
      if (!res.busy()) ImGui::TextDisabled("Choose a model and prompt, then Run.");
      return;
    }
    if (!current(s)) {
      // Shown until the new one arrives, never as if it were the answer to the current request.
      ImGui::PushStyleColor(ImGuiCol_Text, ImVec4(1.0f, 0.75f, 0.3f, 1.0f));
      ImGui::TextWrapped("stale: these results are for the prompt \"%s\" on %s%s",
                         rep->spec.prompt.c_str(),
                         llama2c::model_name_from_path(rep->model).c_str(),
                         res.busy() ? "; the new run is on its way" : "; Run to update");
      ImGui::PopStyleColor();
    } else if (requested_ && current_request() != *requested_) {
      ImGui::TextDisabled("the controls above changed since this run: Run to update");
    }
    if (selected_ < 0 || selected_ >= static_cast<int>(rep->runs.size())) selected_ = 0;
    draw_summary_line(*rep, res.seconds);
    // The table at the width its columns need and the KL plot beside it; the plot under the
    // table when the two would not fit side by side (2x and more in a panel). The row takes
    // 45% of the height left (at least 260 px at 1x), the texts below it the rest.
    const ImVec2 avail = ImGui::GetContentRegionAvail();
    const float gap = ImGui::GetStyle().ItemSpacing.x;
    const float row_h = std::max(px(260), 0.45f * avail.y);
    const float table_w = std::min(table_width(*rep), avail.x);
    const bool side_by_side = avail.x - table_w - gap >= min_plot_size().x;
    const float rows = static_cast<float>(rep->runs.size() + (rep->spec.has_continuation ? 2 : 1));
    const float table_h = side_by_side
                              ? row_h
                              : std::min(row_h, rows * (ImGui::GetTextLineHeight() +
                                                        2 * ImGui::GetStyle().CellPadding.y) +
                                                    px(8));
    ImGui::BeginChild("##table", ImVec2(side_by_side ? table_w : avail.x, table_h), false);
    draw_table(*rep);
    ImGui::EndChild();
    if (side_by_side) ImGui::SameLine();
    // Under the table, the plot takes what the table leaves of the row (the texts follow).
    const float kl_h =
        side_by_side ? row_h : std::min(row_h, avail.y - table_h - ImGui::GetStyle().ItemSpacing.y);
    ImGui::BeginChild("##kl", ImVec2(0, std::max(kl_h, min_plot_size().y)), false);
    draw_kl_plot(*rep);
    ImGui::EndChild();
    draw_texts(*rep);
  }

  nlohmann::json export_json(const AppState& s) const override {
    const Result& res = s.result(kOutputResult);
    const auto rep = res.ptr<GenerateReport>();
    if (!rep) return nullptr;
    nlohmann::json j = rep->to_json();
    j["fresh"] = current(s);  // false: computed for an earlier request (shown marked stale)
    return j;
  }
  std::string export_csv(const AppState& s) const override {
    const auto rep = s.result(kOutputResult).ptr<GenerateReport>();
    if (!rep) return {};
    std::string csv = "method,ratio,top1_agreement,mean_kl,perplexity,first_divergence\n";
    for (const GenerateRun& r : rep->runs) {
      char line[256];
      std::snprintf(line, sizeof line, "%s,%g,%.6f,%.6g,%.6g,%d\n", r.method.c_str(), r.ratio,
                    r.top1_agreement, r.mean_kl, r.perplexity, r.first_divergence);
      csv += line;
    }
    return csv;
  }

  // The controls (model, prompt, N, steps, methods, ratios, ...) are kept in sessions.
  nlohmann::json save_state() const override {
    nlohmann::json ratios = nlohmann::json::array();
    for (size_t i = 0; i < std::size(kRatios); ++i)
      if (ratio_on_[i]) ratios.push_back(kRatios[i]);
    return {{"checkpoint", checkpoint_},
            {"tokenizer", tokenizer_},
            {"prompt", prompt_},
            {"continuation", continuation_},
            {"use_continuation", use_continuation_},
            {"compress_at", compress_at_},
            {"steps", steps_},
            {"recompress_every", recompress_},
            {"seed", seed_},
            {"methods", methods_},
            {"ratios", ratios}};
  }
  void load_state(const nlohmann::json& j) override {
    // Every field is checked before anything changes; a wrong one throws InputError naming it
    // ("session field \"views.output.steps\": ..."), and AppUi::load_session refuses the session.
    const JsonField f(j, "session", "views.output");
    auto text = [&](const char* field, const char* current, size_t capacity) {
      const std::string v = f.get(field, current);
      if (v.size() >= capacity)
        f.at(field).fail(std::to_string(v.size()) + " bytes, at most " +
                         std::to_string(capacity - 1));
      return v;
    };
    const std::string checkpoint = text("checkpoint", checkpoint_, sizeof checkpoint_);
    const std::string tokenizer = text("tokenizer", tokenizer_, sizeof tokenizer_);
    const std::string prompt = text("prompt", prompt_, sizeof prompt_);
    const std::string continuation = text("continuation", continuation_, sizeof continuation_);
    const bool use_continuation = f.get("use_continuation", use_continuation_);
    const int compress_at = f.get("compress_at", compress_at_, 0, 1 << 20);
    const int steps = f.get("steps", steps_, 1, 4096);
    const int recompress = f.get("recompress_every", recompress_, 0, 4096);
    const int seed = f.get("seed", seed_, 0, 1 << 30);
    std::vector<std::string> methods = methods_;
    if (const std::optional<JsonField> ms = f.find("methods")) {
      methods.clear();
      for (const JsonField& m : ms->elements()) {
        const std::string name = m.string();
        if (!find_method(name) || name == "exact")
          m.fail("'" + name + "' is not a compression method");
        // The list offers no layer-level method (adakv, chunkkv, compactor): generation
        // compresses each head's cache on its own, so a session may not ask for one either.
        if (find_method(name)->needs_layer())
          m.fail("'" + name +
                 "' needs every kv head of a layer at once, which generation does not give");
        if (std::find(methods.begin(), methods.end(), name) != methods.end())
          m.fail("'" + name + "' is listed twice");
        methods.push_back(name);
      }
    }
    bool ratio_on[std::size(kRatios)];
    std::copy(std::begin(ratio_on_), std::end(ratio_on_), ratio_on);
    if (const std::optional<JsonField> rs = f.find("ratios")) {
      std::fill(std::begin(ratio_on), std::end(ratio_on), false);
      for (const JsonField& r : rs->elements()) {
        const double x = r.number();
        const auto* it = std::find(std::begin(kRatios), std::end(kRatios), x);
        if (it == std::end(kRatios))
          r.fail(r.json().dump() + " is not 1/2, 1/4, 1/8, 1/16 or 0.75");
        ratio_on[it - std::begin(kRatios)] = true;
      }
    }
    std::snprintf(checkpoint_, sizeof checkpoint_, "%s", checkpoint.c_str());
    std::snprintf(tokenizer_, sizeof tokenizer_, "%s", tokenizer.c_str());
    std::snprintf(prompt_, sizeof prompt_, "%s", prompt.c_str());
    std::snprintf(continuation_, sizeof continuation_, "%s", continuation.c_str());
    use_continuation_ = use_continuation;
    compress_at_ = compress_at;
    steps_ = steps;
    recompress_ = recompress;
    seed_ = seed;
    methods_ = std::move(methods);
    std::copy(std::begin(ratio_on), std::end(ratio_on), ratio_on_);
    restored_ = true;
  }

 private:
  void init_from_capture(const AppState& s) {
    // Default model and prompt: the open capture's, when its model is bundled; else kjv3M.
    // By the open capture, not its path: a new capture saved under another name is the same one.
    const std::string capture = std::to_string(s.capture_id);
    if (capture == initialised_for_ && checkpoint_[0] != '\0' && !restored_) return;
    // Choices a session restored (load_state) belong to the capture the session opens: they wait
    // while it loads, then stand instead of its defaults.
    if (restored_ && !s.loading_path.empty()) return;
    const bool restored = std::exchange(restored_, false);
    initialised_for_ = capture;
    const BundledModel* m = nullptr;
    if (const CaptureInfo* ci = s.info(); ci && !restored) {
      m = find_bundled_model(ci->model);
      if (m) std::snprintf(prompt_, sizeof prompt_, "%s", ci->prompt.c_str());
    }
    if (!m) m = find_bundled_model("kjv3M");
    if (!m && !bundled_models().empty()) m = &bundled_models().front();
    if (!m) return;
    if (prompt_[0] == '\0')
      std::snprintf(prompt_, sizeof prompt_, "%s",
                    m->name == "kjv3M" ? "In the beginning" : "Once upon a time");
    if (!restored || checkpoint_[0] == '\0') {
      std::snprintf(checkpoint_, sizeof checkpoint_, "%s", m->checkpoint.c_str());
      std::snprintf(tokenizer_, sizeof tokenizer_, "%s", m->tokenizer.c_str());
    }
    // A new capture runs its model's default comparison, as the first showing of the view does.
    requested_ = current_request();
  }

  OutputRequest current_request() const {
    OutputRequest rq;
    rq.checkpoint = checkpoint_;
    rq.tokenizer = tokenizer_;
    rq.prompt = prompt_;
    rq.has_continuation = use_continuation_;
    if (use_continuation_) rq.continuation = continuation_;
    rq.compress_at = compress_at_;
    rq.steps = steps_;
    rq.recompress_every = recompress_;
    rq.seed = seed_;
    rq.methods = methods_;
    for (size_t i = 0; i < std::size(kRatios); ++i)
      if (ratio_on_[i]) rq.ratios.push_back(kRatios[i]);
    return rq;
  }

  void draw_controls(AppState& s) {
    const auto& models = bundled_models();
    ImGui::SetNextItemWidth(px(150));
    if (ImGui::BeginCombo("##model", llama2c::model_name_from_path(checkpoint_).c_str())) {
      for (const BundledModel& m : models)
        if (ImGui::Selectable(m.name.c_str(), m.checkpoint == checkpoint_)) {
          std::snprintf(checkpoint_, sizeof checkpoint_, "%s", m.checkpoint.c_str());
          std::snprintf(tokenizer_, sizeof tokenizer_, "%s", m.tokenizer.c_str());
        }
      ImGui::EndCombo();
    }
    // Text fields narrower than their usual width when the panel is (fit_width, measured on the
    // line toolbar_next chose): never wider than the view.
    toolbar_next(labelled_width(px(300), "checkpoint"));
    ImGui::SetNextItemWidth(fit_width(300, "checkpoint"));
    ImGui::InputText("checkpoint##out", checkpoint_, sizeof checkpoint_);
    toolbar_next(labelled_width(px(260), "tokenizer"));
    ImGui::SetNextItemWidth(fit_width(260, "tokenizer"));
    ImGui::InputText("tokenizer##out", tokenizer_, sizeof tokenizer_);
    ImGui::SetNextItemWidth(fit_width(360, "prompt"));
    ImGui::InputText("prompt##out", prompt_, sizeof prompt_);
    auto int_field = [](const char* label, int* v, int lo, int hi) {
      toolbar_next(labelled_width(px(56), label));
      ImGui::SetNextItemWidth(px(56));
      ImGui::InputInt(label, v, 0);
      *v = std::clamp(*v, lo, hi);
    };
    int_field("N (0: prompt end)", &compress_at_, 0, 1 << 20);
    int_field("steps", &steps_, 1, 4096);
    int_field("re-compress every", &recompress_, 0, 4096);
    int_field("seed", &seed_, 0, 1 << 30);

    // Checkboxes flow onto as many lines as the panel needs (toolbar_next: a SameLine undone
    // by a NewLine counted the gap after the last box as content, 8 px past the view's edge).
    auto flow = [&](const char* label) {
      toolbar_next(ImGui::GetFrameHeight() + ImGui::GetStyle().ItemInnerSpacing.x +
                   ImGui::CalcTextSize(label).x);
    };
    ImGui::TextUnformatted("methods:");
    for (const Method* m : app_methods()) {
      // Generation compresses one head at a time: methods that need the whole layer at once
      // (adakv, chunkkv, compactor) are refused there, so they are not offered.
      if (m->name() == "exact" || m->needs_layer()) continue;
      flow(m->name().c_str());
      bool on = std::find(methods_.begin(), methods_.end(), m->name()) != methods_.end();
      if (method_checkbox(s, *m, &on, "output:method:" + m->name())) {
        if (on)
          methods_.push_back(m->name());
        else
          methods_.erase(std::remove(methods_.begin(), methods_.end(), m->name()), methods_.end());
      }
    }
    ImGui::TextUnformatted("ratios:");
    for (size_t i = 0; i < std::size(kRatios); ++i) {
      const std::string label = ratio_label(kRatios[i]);
      flow(label.c_str());
      bool on = ratio_on_[i];
      if (ImGui::Checkbox(label.c_str(), &on)) ratio_on_[i] = on;
    }
    flow("continuation (perplexity):");
    ImGui::Checkbox("continuation (perplexity):", &use_continuation_);
    if (use_continuation_) {
      toolbar_next(px(200));  // the field takes the rest of the line: at least 200 px of it
      ImGui::SetNextItemWidth(-1);
      ImGui::InputText("##continuation", continuation_, sizeof continuation_);
    }

    if (s.result(kOutputResult).busy()) {
      const auto [done, total] = s.progress(kOutputResult);
      char overlay[96];
      std::snprintf(overlay, sizeof overlay, "%d/%d forward passes", done, total);
      ImGui::ProgressBar(total > 0 ? static_cast<float>(done) / total : 0.0f, ImVec2(px(360), 0),
                         total > 0 ? overlay : "queued");
      ImGui::SameLine();
      if (ImGui::Button("Cancel")) s.cancel_job(kOutputResult);
    } else if (ImGui::Button("Run", ImVec2(px(100), 0))) {
      // The request is a view choice; reconcile() starts the run its key asks for (again after a
      // Cancel of the same request).
      requested_ = current_request();
      s.run_now(kOutputResult);
    }
  }

  void draw_summary_line(const GenerateReport& rep, double seconds) {
    ImGui::TextWrapped(
        "%s: compressed at N = %d (s = %d sinks, window %d), %d steps, %s",
        llama2c::model_name_from_path(rep.model).c_str(), rep.spec.compress_at, rep.sink,
        rep.window, rep.spec.steps,
        rep.spec.recompress_every > 0
            ? ("re-compressed every " + std::to_string(rep.spec.recompress_every)).c_str()
            : "compressed once");
    // The time leads the second line: wrapped at the end of the first, ImGui broke "0.1" at
    // its point.
    ImGui::TextDisabled(
        "ran in %.1f s; top-1 and KL teacher-forced on the exact run's tokens; text below is "
        "free-running greedy",
        seconds);
  }

  // The headers and the widest text each column holds (the numbers at their widest).
  static std::vector<std::pair<const char*, std::string>> table_columns(const GenerateReport& rep) {
    std::string method = "exact cache", ratio = "1";
    for (const GenerateRun& r : rep.runs) {
      if (ImGui::CalcTextSize(r.method.c_str()).x > ImGui::CalcTextSize(method.c_str()).x)
        method = r.method;
      const std::string label = ratio_label(r.ratio);
      if (ImGui::CalcTextSize(label.c_str()).x > ImGui::CalcTextSize(ratio.c_str()).x)
        ratio = label;
    }
    std::vector<std::pair<const char*, std::string>> cols = {{"method", method},
                                                             {"ratio", ratio},
                                                             {"top-1 agree", "100.0%"},
                                                             {"mean KL", "0.0000"},
                                                             {"diverges at", "step 0000"}};
    if (rep.spec.has_continuation) cols.push_back({"perplexity", "0000.000"});
    return cols;
  }

  // The table's width with every column as wide as its widest text.
  static float table_width(const GenerateReport& rep) {
    const ImGuiStyle& st = ImGui::GetStyle();
    float w = px(4);
    for (const auto& [header, widest] : table_columns(rep))
      w += std::max(ImGui::CalcTextSize(header).x, ImGui::CalcTextSize(widest.c_str()).x) +
           2 * st.CellPadding.x + px(2);
    return w + st.ScrollbarSize;
  }

  void draw_table(const GenerateReport& rep) {
    const bool ppl = rep.spec.has_continuation;
    const int cols = ppl ? 6 : 5;
    // Columns fit their text (no "meth..." at 2.5x); a table wider than its place scrolls.
    if (!ImGui::BeginTable("##agreement", cols,
                           ImGuiTableFlags_Borders | ImGuiTableFlags_RowBg |
                               ImGuiTableFlags_ScrollY | ImGuiTableFlags_ScrollX |
                               ImGuiTableFlags_SizingFixedFit))
      return;
    ImGui::TableSetupScrollFreeze(0, 1);
    ImGui::TableSetupColumn("method");
    ImGui::TableSetupColumn("ratio");
    ImGui::TableSetupColumn("top-1 agree");
    ImGui::TableSetupColumn("mean KL");
    ImGui::TableSetupColumn("diverges at");
    if (ppl) ImGui::TableSetupColumn("perplexity");
    ImGui::TableHeadersRow();
    if (ppl) {
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::TextDisabled("exact cache");
      for (int c = 0; c < 4; ++c) ImGui::TableNextColumn();
      ImGui::TableNextColumn();
      ImGui::Text("%.3f", rep.exact_perplexity);
    }
    for (size_t i = 0; i < rep.runs.size(); ++i) {
      const GenerateRun& r = rep.runs[i];
      ImGui::TableNextRow();
      ImGui::TableNextColumn();
      ImGui::PushID(static_cast<int>(i));
      if (ImGui::Selectable(r.method.c_str(), selected_ == static_cast<int>(i),
                            ImGuiSelectableFlags_SpanAllColumns))
        selected_ = static_cast<int>(i);
      ImGui::PopID();
      ImGui::TableNextColumn();
      ImGui::TextUnformatted(ratio_label(r.ratio).c_str());
      ImGui::TableNextColumn();
      ImGui::Text("%.1f%%", 100.0 * r.top1_agreement);
      ImGui::TableNextColumn();
      ImGui::Text("%.4f", r.mean_kl);
      ImGui::TableNextColumn();
      if (r.first_divergence < 0)
        ImGui::TextDisabled("never");
      else
        ImGui::Text("step %d", r.first_divergence);
      if (ppl) {
        ImGui::TableNextColumn();
        ImGui::Text("%.3f", r.perplexity);
      }
    }
    ImGui::EndTable();
  }

  void draw_kl_plot(const GenerateReport& rep) {
    // Every method at the selected run's ratio, one line each.
    const double ratio = rep.runs[selected_].ratio;
    std::vector<const GenerateRun*> runs;
    for (const GenerateRun& r : rep.runs)
      if (r.ratio == ratio) runs.push_back(&r);
    double hi = 0;
    for (const GenerateRun* r : runs)
      for (double v : r->kl) hi = std::max(hi, v);
    Axis x{"generated step (position N + 1 + step)", 0, std::max(1.0, rep.spec.steps - 1.0)};
    Axis y{"nats", 0, hi > 0 ? hi * 1.08 : 1.0};
    Plot plot("##klplot", ImVec2(0, 0),
              "KL(exact || compressed) of the next token, every method at " + ratio_label(ratio), x,
              y);
    std::vector<double> steps(rep.spec.steps);
    for (int t = 0; t < rep.spec.steps; ++t) steps[t] = t;
    std::vector<Plot::LegendEntry> legend;
    std::vector<std::string> drawn;
    for (const GenerateRun* r : runs) drawn.push_back(r->method);
    const MethodColours colours(drawn);
    for (size_t k = 0; k < runs.size(); ++k) {
      const ImU32 col = colours(runs[k]->method);
      const bool focus = runs[k] == &rep.runs[selected_];
      plot.line(steps, runs[k]->kl, focus ? col : with_alpha(col, 0.55f), focus ? 2.5f : 1.2f);
      legend.push_back({runs[k]->method, col});
    }
    plot.legend(legend);
    const int i = plot.nearest_x(steps);
    if (i >= 0) {
      plot.vline(i, kColGrid);
      ImGui::BeginTooltip();
      ImGui::Text("step %d: exact token '%s'", i, printable(rep.exact_text[i]).c_str());
      for (const GenerateRun* r : runs) ImGui::Text("%s: KL %.4f", r->method.c_str(), r->kl[i]);
      ImGui::EndTooltip();
    }
  }

  // Tokens laid out as wrapped text; `diverges(i)` marks token i with a red background.
  static void token_flow(const char* id, const std::vector<std::string>& prefix,
                         const std::vector<std::string>& tokens,
                         const std::function<bool(int)>& diverges, int first_divergence) {
    ImGui::BeginChild(id, ImVec2(0, 0), true);
    ImDrawList* dl = ImGui::GetWindowDrawList();
    const float right = ImGui::GetWindowPos().x + ImGui::GetWindowContentRegionMax().x;
    const float left = ImGui::GetCursorScreenPos().x;
    const float line_h = ImGui::GetTextLineHeightWithSpacing();
    ImVec2 pos = ImGui::GetCursorScreenPos();
    auto put = [&](const std::string& text, ImU32 fg, ImU32 bg) {
      const ImVec2 size = ImGui::CalcTextSize(text.c_str());
      if (pos.x + size.x > right && pos.x > left) {
        pos.x = left;
        pos.y += line_h;
      }
      if (bg) dl->AddRectFilled(pos, ImVec2(pos.x + size.x, pos.y + size.y), bg, 2.0f);
      dl->AddText(pos, fg, text.c_str());
      pos.x += size.x;
    };
    for (const std::string& p : prefix) put(printable(p), IM_COL32(150, 154, 160, 255), 0);
    for (size_t i = 0; i < tokens.size(); ++i) {
      const bool bad = diverges(static_cast<int>(i));
      if (static_cast<int>(i) == first_divergence)
        dl->AddLine(ImVec2(pos.x, pos.y - 1), ImVec2(pos.x, pos.y + line_h - 2),
                    IM_COL32(255, 230, 60, 255), 2.0f);
      put(printable(tokens[i]), bad ? IM_COL32(255, 255, 255, 255) : IM_COL32(225, 228, 232, 255),
          bad ? IM_COL32(170, 50, 50, 255) : 0);
    }
    ImGui::SetCursorScreenPos(ImVec2(left, pos.y + line_h));
    ImGui::Dummy(ImVec2(1, 1));
    ImGui::EndChild();
  }

  void draw_texts(const GenerateReport& rep) {
    const GenerateRun& r = rep.runs[selected_];
    // The shared prefix in grey: its last 48 tokens (the whole of it when shorter).
    constexpr size_t kShown = 48;
    std::vector<std::string> prefix;
    const size_t first = rep.prefix_text.size() > kShown + 1 ? rep.prefix_text.size() - kShown : 1;
    if (first > 1) prefix.push_back("... ");
    for (size_t i = first; i < rep.prefix_text.size(); ++i) prefix.push_back(rep.prefix_text[i]);
    const size_t differ = static_cast<size_t>(
        std::count_if(r.tokens.begin(), r.tokens.end(),
                      [&, t = 0](int tok) mutable { return tok != rep.exact_tokens[t++]; }));
    // Each column titled inside itself, so a narrow window wraps the title instead of clipping.
    const float half = ImGui::GetContentRegionAvail().x * 0.5f - 4;
    ImGui::BeginChild("##exactcol", ImVec2(half, 0), false);
    ImGui::TextWrapped("exact cache");
    token_flow(
        "##exacttext", prefix, rep.exact_text, [](int) { return false; }, -1);
    ImGui::EndChild();
    ImGui::SameLine();
    ImGui::BeginChild("##compcol", ImVec2(0, 0), false);
    ImGui::TextWrapped("%s at %s: %zu/%d tokens differ from exact at the same step",
                       r.method.c_str(), ratio_label(r.ratio).c_str(), differ, rep.spec.steps);
    token_flow(
        "##comptext", prefix, r.text, [&](int i) { return r.tokens[i] != rep.exact_tokens[i]; },
        r.first_divergence);
    ImGui::EndChild();
  }

  std::optional<OutputRequest> requested_;  // empty until a model is known
  std::string initialised_for_ = "\x01";
  char checkpoint_[1024] = "";
  char tokenizer_[1024] = "";
  char prompt_[1024] = "";
  char continuation_[4096] = "";
  int compress_at_ = 128, steps_ = 64, recompress_ = 0, seed_ = 0;
  std::vector<std::string> methods_;
  bool ratio_on_[std::size(kRatios)] = {};
  bool use_continuation_ = false;
  bool restored_ = false;  // load_state set the controls: the next init keeps them
  int selected_ = 0;
};

}  // namespace

std::unique_ptr<View> make_output_view() {
  return std::make_unique<OutputView>();
}

}  // namespace kvscope::app
