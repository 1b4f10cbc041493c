// A view is one tab of the KVScope window: it draws the app state with ImGui / ImDrawList (no GL
// calls, so the very same code renders headless through the software rasteriser of
// kvscope-cli render), edits settings, plans its own derived results, and exports its numbers.
//
// Adding a view: write app/views/view_<name>.cpp defining `std::unique_ptr<View>
// make_<name>_view()`, declare it below and add one line to make_views() (app_frame.cpp).
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app/app_state.h"

namespace kvscope::app {

enum class Panel { Left, Main };

class View {
 public:
  virtual ~View() = default;
  // Short lower-case id used by --view and in sessions: "capture", "geometry", ...
  virtual const char* name() const = 0;
  // Tab label.
  virtual const char* title() const = 0;
  // One paragraph for the Help window: what the view shows and how to use it.
  virtual const char* help() const { return ""; }
  // Which panel's tab bar holds this view.
  virtual Panel panel() const { return Panel::Main; }
  // Draws into the current ImGui window; the available region is the view's area.
  virtual void draw(AppState& s) = 0;
  // Headless screenshots wait until the worker is idle AND ready() holds (e.g. a t-SNE that is
  // still converging through intermediate posts can say "not yet").
  virtual bool ready(const AppState& s) const { return true; }
  // The view's numbers for File > Export (null / empty when it has none).
  virtual nlohmann::json export_json(const AppState& s) const { return nullptr; }
  virtual std::string export_csv(const AppState& s) const { return {}; }
  // The view's own derived results (e.g. a projection), planned from the settings and the view's
  // choices every frame; AppState::reconcile starts, keeps or cancels them. Results are then in
  // s.result(name).
  virtual void plan(const AppState& s, std::vector<NamedPlan>& out) const {}
  // Per-view UI state saved in sessions.
  virtual nlohmann::json save_state() const { return nullptr; }
  virtual void load_state(const nlohmann::json& j) {}
};

std::unique_ptr<View> make_capture_view();
std::unique_ptr<View> make_method_view();
std::unique_ptr<View> make_tokens_view();
std::unique_ptr<View> make_error_view();
std::unique_ptr<View> make_output_view();  // view_output.cpp: what compression does to the text
std::unique_ptr<View> make_geometry_view();
std::unique_ptr<View> make_walk_view();
std::unique_ptr<View> make_teaching_view();
std::unique_ptr<View> make_theory_view();  // view_theory.cpp: the papers' scaling claims
std::unique_ptr<View> make_set_view();     // view_set.cpp: evidence across a capture set

// All views in display order: the one list (app_frame.cpp). Adding a view: its file, its
// factory above, one line in make_views().
std::vector<std::unique_ptr<View>> make_views();
// Adds a view after the built-in ones, as if `factory` were a line of make_views(): from then on
// its tab, --view, kvscope-cli render, the help window and sessions know it. For plugins and
// tests; call it before the first AppUi is made. Throws std::invalid_argument when the factory
// makes no view or one whose name is taken (view_registry.cpp).
using ViewFactory = std::function<std::unique_ptr<View>()>;
void register_view(ViewFactory factory);
// Removes the registered view of that name (a test's, so later tests see the built-in list).
void unregister_view(const std::string& name);
// The registered factories, in order (make_views() appends their views).
const std::vector<ViewFactory>& registered_views();
// Their names ("capture", "method", ...), and the same joined by ", " for help texts.
std::vector<std::string> view_names();
std::string view_names_text();

}  // namespace kvscope::app
