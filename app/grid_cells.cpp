#include "app/grid_cells.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "app/worker.h"
#include "engine/core/error.h"
#include "engine/core/thread_pool.h"
#include "engine/eval/seed_stats.h"
#include "engine/ops/backend.h"

#ifdef __linux__
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace kvscope::app {

// ---------------------------------------------------------------- store

const GridCell* GridCellStore::find(const std::string& key) const {
  auto it = cells_.find(key);
  return it == cells_.end() ? nullptr : it->second.get();
}

std::shared_ptr<const GridCell> GridCellStore::get(const std::string& key) const {
  auto it = cells_.find(key);
  return it == cells_.end() ? nullptr : it->second;
}

void GridCellStore::insert(const std::string& key, HeadEval eval) {
  auto cell = std::make_shared<GridCell>();
  cell->eval = std::move(eval);
  cell->serial = ++computed_;
  cells_[key] = std::move(cell);
  ++version_;
}

void GridCellStore::trim(size_t max_cells, const std::set<std::string>& keep) {
  if (cells_.size() <= max_cells) return;
  for (auto it = cells_.begin(); it != cells_.end();)
    it = keep.count(it->first) ? std::next(it) : cells_.erase(it);
  ++version_;
}

void GridCellStore::clear() {
  cells_.clear();
  ++version_;
}

const char* cell_state_name(CellState s) {
  switch (s) {
    case CellState::Missing:
      return "missing";
    case CellState::Stale:
      return "stale";
    case CellState::Partial:
      return "partial";
    case CellState::Fresh:
      return "fresh";
  }
  return "?";
}

const HeadEval* GridReport::find(int slot, int layer, int kv_head, const GridEntry** entry) const {
  for (size_t i = 0; i < entries.size() && i < report.results.size(); ++i) {
    const HeadEval& h = report.results[i];
    if (entries[i].slot == slot && h.layer == layer && h.kv_head == kv_head) {
      if (entry) *entry = &entries[i];
      return &h;
    }
  }
  return nullptr;
}

size_t GridJob::missing() const {
  size_t n = 0;
  for (const Need& need : needs) n += need.have ? 0 : 1;
  return n;
}

// ---------------------------------------------------------------- assembly

namespace {

// One head over the seeds in `seq` (seed order; a seed-free method's one run repeated), summed
// as run_eval sums a head's seeds.
HeadEval combine(const std::vector<const HeadEval*>& seq) {
  HeadEval he = *seq[0];
  he.per_seed.clear();
  he.note.clear();
  he.saturation = -1;
  for (const HeadEval* s : seq)
    if (he.note.empty()) he.note = s->note;
  if (he.refused) return he;
  for (const HeadEval* s : seq)
    if (!s->error.empty()) {
      he.error = s->error;
      he.per_seed.clear();
      he.per_query.clear();
      he.mean = he.std = he.normalized_mean = he.mass_mean = 0;
      return he;
    }
  const double k = static_cast<double>(seq.size());
  std::vector<double> norm, mass;
  std::vector<double> per_query(seq[0]->per_query.size(), 0.0);
  for (size_t r = 0; r < seq.size(); ++r) {
    const HeadEval& s = *seq[r];
    if (s.saturation >= 0) he.saturation = (r == 0 ? 0.0 : he.saturation) + s.saturation / k;
    he.per_seed.push_back(s.per_seed.empty() ? s.mean : s.per_seed[0]);
    norm.push_back(s.normalized_mean);
    mass.push_back(s.mass_mean);
    for (size_t e = 0; e < per_query.size() && e < s.per_query.size(); ++e)
      per_query[e] += s.per_query[e];
  }
  for (double& v : per_query) v /= k;
  he.per_query = std::move(per_query);
  std::tie(he.mean, he.std) = mean_std(he.per_seed);
  he.normalized_mean = mean_std(norm).first;
  he.mass_mean = mean_std(mass).first;
  return he;
}

}  // namespace

std::shared_ptr<GridReport> assemble_grid(
    const GridJob& job, const std::vector<std::shared_ptr<const GridCell>>& cells) {
  auto g = std::make_shared<GridReport>();
  EvalReport& rep = g->report;
  rep.info = job.capture->info();
  rep.capture_path = rep.info.path;
  rep.spec = job.base;
  rep.spec.seeds = job.seeds;
  rep.spec.base_seed = job.base_seed;
  rep.spec.methods.clear();
  rep.spec.params.clear();
  rep.proxy_queries = !rep.info.has_queries;
  g->seeds = job.seeds;
  for (size_t k = 0; k < 2; ++k) {
    const GridJob::Slot& sl = job.slots[k];
    if (!sl.method) continue;
    g->methods[k] = sl.name;
    g->params[k] = sl.params;
    if (std::find(rep.spec.methods.begin(), rep.spec.methods.end(), sl.method) ==
        rep.spec.methods.end()) {
      rep.spec.methods.push_back(sl.method);
      if (!sl.params.empty()) rep.spec.params[sl.name] = sl.params;
    }
  }
  // Needs by (slot, layer, head): their runs in seed order.
  const size_t heads = static_cast<size_t>(job.layers) * static_cast<size_t>(job.heads);
  std::array<std::vector<std::vector<size_t>>, 2> by_head;
  for (auto& v : by_head) v.assign(heads, {});
  for (size_t i = 0; i < job.needs.size(); ++i) {
    const GridJob::Need& n = job.needs[i];
    by_head[static_cast<size_t>(n.slot)][static_cast<size_t>(n.layer * job.heads + n.head)]
        .push_back(i);
    g->cells_total += 1;
    g->cells_done += cells[i] ? 1 : 0;
    g->slot_total[static_cast<size_t>(n.slot)] += 1;
    g->slot_done[static_cast<size_t>(n.slot)] += cells[i] ? 1 : 0;
  }
  for (int l = 0; l < job.layers; ++l)
    for (int h = 0; h < job.heads; ++h)
      for (int k = 0; k < 2; ++k) {
        const GridJob::Slot& sl = job.slots[static_cast<size_t>(k)];
        if (!sl.method) continue;
        std::vector<size_t> idx =
            by_head[static_cast<size_t>(k)][static_cast<size_t>(l * job.heads + h)];
        std::sort(idx.begin(), idx.end(),
                  [&](size_t a, size_t b) { return job.needs[a].run < job.needs[b].run; });
        GridEntry e;
        e.slot = k;
        std::vector<const HeadEval*> seq;
        for (size_t i : idx) {
          e.keys.push_back(job.needs[i].key);
          if (cells[i]) seq.push_back(&cells[i]->eval);
        }
        HeadEval he;
        he.method = sl.name;
        he.ratio = job.base.ratios.empty() ? 0 : job.base.ratios[0];
        he.layer = l;
        he.kv_head = h;
        if (!seq.empty()) {
          // A seed-free method's one run stands for every seed (as in run_eval).
          if (sl.runs == 1 && job.seeds > 1 && !idx.empty() && seq.size() == 1)
            seq.assign(static_cast<size_t>(job.seeds), seq[0]);
          he = combine(seq);
          e.seeds_done = static_cast<int>(sl.runs == 1 ? job.seeds : seq.size());
          e.state = e.seeds_done >= job.seeds ? CellState::Fresh : CellState::Partial;
        } else if (job.previous) {
          const GridEntry* pe = nullptr;
          const HeadEval* ph = job.previous->find(k, l, h, &pe);
          // The earlier settings' value of the same slot, while this one computes.
          if (ph && pe && pe->state != CellState::Missing &&
              job.previous->methods[static_cast<size_t>(k)] == sl.name) {
            he = *ph;
            e.state = CellState::Stale;
          }
        }
        rep.results.push_back(std::move(he));
        g->entries.push_back(std::move(e));
      }
  return g;
}

// ---------------------------------------------------------------- the job

namespace {

// The grid's threads run below the UI and the focused runs: the grid is what the user did not
// ask for this second. The lowest nice value: on two cores the UI thread (and a software GL
// rasteriser) is otherwise preempted by the grid in the middle of a frame.
void lower_thread_priority() {
#ifdef __linux__
  static thread_local bool lowered = false;
  if (lowered) return;
  lowered = true;
  const int tid = static_cast<int>(syscall(SYS_gettid));
  const int now = getpriority(PRIO_PROCESS, static_cast<id_t>(tid));
  if (now < 19) setpriority(PRIO_PROCESS, static_cast<id_t>(tid), 19);
#endif
}

// Which missing cell comes next: method A before B, seed 0 of every cell before the other
// seeds, then the focused cell, the rows on screen, the other rows nearest the focus first.
auto rank(const GridJob::Need& n, const GridPriority* p) {
  const int fl = p ? p->focus_layer.load() : 0, fh = p ? p->focus_head.load() : 0;
  const int v0 = p ? p->visible_first.load() : -1, v1 = p ? p->visible_last.load() : -1;
  const int band = n.layer == fl && n.head == fh                 ? 0
                   : (v0 >= 0 && n.layer >= v0 && n.layer <= v1) ? 1
                                                                 : 2;
  return std::make_tuple(n.slot, n.run, band, std::abs(n.layer - fl), n.layer, n.head);
}

// The cells one thread computes in one run_eval call.
struct CellBatch {
  size_t first = 0;           // the best-ranked pending cell
  std::vector<size_t> cells;  // first, and with by_layer the cells computed with it
  int prefetch = -1;          // a layer to load ahead before computing them, -1 for none
};

// One run of the grid job: the cells in hand and the pending ones, and what the threads that
// compute them share. Once the threads start, every member they change is guarded by `mu`.
struct GridRun {
  const GridJob& job;
  JobContext& ctx;
  const std::function<void(const GridJob::Need&, const HeadEval&, const CellTiming&)>& cell_done;
  const std::function<void(std::shared_ptr<const GridReport>)>& report;
  std::vector<std::shared_ptr<const GridCell>> cells;  // cells[i] for job.needs[i]
  std::vector<size_t> pending;                         // the needs not computed yet
  // The time left: the pace of the cells done, the cells being computed and since when.
  GridPace pace;
  std::map<size_t, std::chrono::steady_clock::time_point> in_flight;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  int total = 0, done = 0;
  std::mutex mu;
  std::string error;  // the first cell that failed for a reason other than its method
  int threads = 1;
  // Layers a cell or a prefetch has asked the capture for. Cells take layers in rank order, so
  // with several threads they all reach a new layer together and all but one would wait for its
  // load (34 ms of CPU for a Llama-3-8B layer at 8k tokens; docs/performance.md, "The app's
  // grid"): instead, the thread that takes a cell of a layer in hand first loads the next layer
  // the ranking will reach, while the others go on computing.
  std::deque<int> asked;
  int ahead = -1;  // the layer loaded ahead that no cell has taken yet
  std::chrono::steady_clock::time_point last_post;
  int computed = 0;  // cells this job computed
  bool by_layer = false;
  int grid_threads = 1, eval_threads = 1;

  GridRun(
      const GridJob& job, JobContext& ctx,
      const std::function<void(const GridJob::Need&, const HeadEval&, const CellTiming&)>& cell_done,
      const std::function<void(std::shared_ptr<const GridReport>)>& report);
  void plan_threads();
  bool in_hand(int layer) const;
  void ask(int layer);
  bool take_next(CellBatch* b);
  std::vector<size_t>::iterator method_b_sample();
  int next_b_sample = 1;  // `computed` at which method_b_sample takes its next cell
  void take_batch_mates(std::vector<size_t>* batch);
  int prefetch_next_layer();
  EvalSpec batch_spec(const CellBatch& b) const;
  void post_results(const EvalReport& rep, const std::vector<size_t>& batch,
                    const CellTiming& timing);
  void report_time_left();
  void work();
};

// Takes the cells the store holds; the others are pending.
GridRun::GridRun(
    const GridJob& job, JobContext& ctx,
    const std::function<void(const GridJob::Need&, const HeadEval&, const CellTiming&)>& cell_done,
    const std::function<void(std::shared_ptr<const GridReport>)>& report)
    : job(job),
      ctx(ctx),
      cell_done(cell_done),
      report(report),
      cells(job.needs.size()),
      pace(job.layers, job.heads, job.pace_prior) {
  for (size_t i = 0; i < job.needs.size(); ++i) {
    cells[i] = job.needs[i].have;
    if (!cells[i]) pending.push_back(i);
  }
  for (int l = 0; l < job.layers; ++l)
    for (int h = 0; h < job.heads; ++h) {
      const size_t i = static_cast<size_t>(l) * static_cast<size_t>(job.heads) + h;
      if (i < job.exact_in_hand.size() && job.exact_in_hand[i]) pace.mark_in_hand(l, h);
    }
  total = static_cast<int>(job.needs.size());
  done = total - static_cast<int>(pending.size());
}

// How many threads compute cells, and how many each run_eval call gets.
void GridRun::plan_threads() {
  threads = std::max(1, std::min(job.threads, static_cast<int>(pending.size())));
  last_post = std::chrono::steady_clock::now();
  // A backend that parallelises inside one call (a device) takes the best-ranked cell together
  // with every pending cell of its layer, slot and seed run: one run_eval over those heads scores
  // them in one attention_errors call (docs/design.md, "Backend ops"). The CPU takes cells one
  // by one.
  by_layer = job.backend && job.backend->parallel_in_one_call();
  // Each thread then holds a whole layer: at most layers_at_once of them, the cores shared out
  // among the layers' selections.
  grid_threads =
      by_layer && job.layers_at_once > 0 ? std::min(threads, job.layers_at_once) : threads;
  eval_threads = by_layer ? std::max(1, job.threads / grid_threads) : 1;
}

bool GridRun::in_hand(int layer) const {
  return std::find(asked.begin(), asked.end(), layer) != asked.end();
}

// Only the last few count as in hand: the cache keeps few layers, and a later seed or method B
// comes back to layers long evicted.
void GridRun::ask(int layer) {
  asked.push_back(layer);
  if (asked.size() > static_cast<size_t>(threads) + 1) asked.pop_front();
}

// Under `mu`: takes the best-ranked pending cell (with by_layer, its batch mates too) and picks
// a layer to load ahead. False when the threads are to stop: nothing is pending, a cell failed,
// or the job is cancelled.
bool GridRun::take_next(CellBatch* b) {
  std::lock_guard<std::mutex> lock(mu);
  if (pending.empty() || !error.empty() || ctx.cancelled()) return false;
  auto best = std::min_element(pending.begin(), pending.end(), [&](size_t a, size_t c) {
    return rank(job.needs[a], job.priority.get()) < rank(job.needs[c], job.priority.get());
  });
  if (const auto early = method_b_sample(); early != pending.end()) best = early;
  b->first = *best;
  pending.erase(best);
  b->cells.push_back(b->first);
  if (by_layer) take_batch_mates(&b->cells);
  const auto now = std::chrono::steady_clock::now();
  for (size_t c : b->cells) in_flight[c] = now;
  const int layer = job.needs[b->first].layer;
  const bool loaded = in_hand(layer);  // else this thread loads it now
  if (!loaded) ask(layer);
  if (layer == ahead) ahead = -1;
  // One layer ahead at most (the capture's layer cache holds few).
  if (grid_threads > 1 && loaded && ahead < 0) b->prefetch = prefetch_next_layer();
  return true;
}

// Called with `mu` held: a cell of method B taken before A's remaining cells, or pending.end().
// B's cells rank after all of A's, so the time left would cost them by the cost model's guess
// until the grid was half done (app/grid_pace.h); instead one of B's cells whose A cell is in (its
// exact side in hand, so nothing waits for a build) is taken after A's focused cell and then
// after every kBSampleEvery of A's cells: B's cost is measured from the start, and more than once
// (the first cells run beside the focused runs, which slows them).
std::vector<size_t>::iterator GridRun::method_b_sample() {
  constexpr int kBSampleEvery = 16;
  if (!job.slots[1].method || computed < next_b_sample) return pending.end();
  std::set<std::pair<int, int>> a_done;  // (layer, head) of A's first-seed cells in
  for (size_t c = 0; c < cells.size(); ++c)
    if (cells[c] && job.needs[c].slot == 0 && job.needs[c].run == 0)
      a_done.insert({job.needs[c].layer, job.needs[c].head});
  // Among them, one whose layer is in hand: a layer loaded again for the sample made B's cells
  // look 2.5 times what they cost (the layer cache keeps few layers).
  auto best = pending.end();
  auto key = [&](size_t c) {
    const GridJob::Need& n = job.needs[c];
    return std::make_pair(!in_hand(n.layer), rank(n, job.priority.get()));
  };
  for (auto it = pending.begin(); it != pending.end(); ++it) {
    const GridJob::Need& n = job.needs[*it];
    if (n.slot != 1 || n.run != 0 || !a_done.count({n.layer, n.head})) continue;
    if (best == pending.end() || key(*it) < key(*best)) best = it;
  }
  if (best != pending.end()) next_b_sample = computed + kBSampleEvery;
  return best;
}

// Called with `mu` held: moves every pending cell of the layer, slot and seed run of batch's one
// cell into batch, and orders the batch by head.
void GridRun::take_batch_mates(std::vector<size_t>* batch) {
  const GridJob::Need& first = job.needs[batch->front()];
  for (auto it = pending.begin(); it != pending.end();) {
    const GridJob::Need& c = job.needs[*it];
    if (c.slot == first.slot && c.layer == first.layer && c.run == first.run) {
      batch->push_back(*it);
      it = pending.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(batch->begin(), batch->end(),
            [&](size_t a, size_t b) { return job.needs[a].head < job.needs[b].head; });
}

// Called with `mu` held: the layer of the best-ranked pending cell whose layer is not in hand,
// asked for and marked as loaded ahead; -1 when every pending cell's layer is in hand.
int GridRun::prefetch_next_layer() {
  const size_t* next = nullptr;
  for (const size_t& c : pending)
    if (!in_hand(job.needs[c].layer) && (!next || rank(job.needs[c], job.priority.get()) <
                                                      rank(job.needs[*next], job.priority.get())))
      next = &c;
  if (!next) return -1;
  ahead = job.needs[*next].layer;
  ask(ahead);
  return ahead;
}

// The run_eval spec of one batch: its slot's method on its layer, heads and seed run.
EvalSpec GridRun::batch_spec(const CellBatch& b) const {
  const GridJob::Need& n = job.needs[b.first];
  const GridJob::Slot& sl = job.slots[static_cast<size_t>(n.slot)];
  EvalSpec spec = job.base;
  spec.methods = {sl.method};
  spec.params.clear();
  if (!sl.params.empty()) spec.params[sl.name] = sl.params;
  spec.layers = {n.layer};
  spec.heads.clear();
  for (size_t c : b.cells) spec.heads.push_back(job.needs[c].head);
  spec.seeds = 1;
  spec.base_seed = job.base_seed + static_cast<uint64_t>(n.run);
  spec.threads = eval_threads;
  return spec;
}

// Under `mu`: keeps each head's result as its cell, reports it (progress, cell_done), and posts
// the partial grid.
void GridRun::post_results(const EvalReport& rep, const std::vector<size_t>& batch,
                           const CellTiming& timing) {
  std::lock_guard<std::mutex> lock(mu);
  const bool first_post = computed == 0;
  for (size_t c : batch) {
    in_flight.erase(c);
    const GridJob::Need& n = job.needs[c];
    pace.cell_done({n.slot, n.layer, n.head}, timing.seconds, timing.build_seconds,
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
  }
  for (const HeadEval& he : rep.results) {  // one per head of the batch
    const auto c = std::find_if(batch.begin(), batch.end(),
                                [&](size_t b) { return job.needs[b].head == he.kv_head; });
    if (c == batch.end()) continue;
    auto cell = std::make_shared<GridCell>();
    cell->eval = he;
    cells[*c] = cell;
    ++done;
    ++computed;
    ctx.progress(done, total);
    if (cell_done) cell_done(job.needs[*c], cell->eval, timing);
  }
  report_time_left();
  const auto now = std::chrono::steady_clock::now();
  // The partial grid at most every 100 ms (the job's first cells at once).
  if (report && (first_post || pending.empty() ||
                 std::chrono::duration<double>(now - last_post).count() > 0.1)) {
    last_post = now;
    report(assemble_grid(job, cells));
  }
}

// Under `mu`: the job's time left by the grid's pace (app/grid_pace.h).
void GridRun::report_time_left() {
  const auto now = std::chrono::steady_clock::now();
  std::vector<GridPace::Cell> left;
  left.reserve(pending.size());
  for (size_t c : pending) left.push_back({job.needs[c].slot, job.needs[c].layer, job.needs[c].head});
  std::vector<GridPace::Running> running;
  for (const auto& [c, since] : in_flight)
    running.push_back({{job.needs[c].slot, job.needs[c].layer, job.needs[c].head},
                       std::chrono::duration<double>(now - since).count()});
  ctx.time_left(pace.left_s(left, running,
                            std::chrono::duration<double>(now - started).count(), grid_threads));
}

// One thread's loop: takes the best-ranked pending cells and computes them until none is left,
// a cell fails or the job is cancelled.
void GridRun::work() {
  lower_thread_priority();
  for (;;) {
    CellBatch b;
    if (!take_next(&b)) return;
    if (b.prefetch >= 0) {
      try {
        job.capture->layer(b.prefetch);  // stays in the capture's layer cache for its cells
      } catch (const std::exception&) {
        // The layer's cells will report it.
      }
    }
    const EvalSpec spec = batch_spec(b);
    const auto t0 = std::chrono::steady_clock::now();
    EvalReport rep;
    try {
      rep = run_eval(*job.capture, spec, {}, ctx.cancel_flag(), job.backend);
    } catch (const Cancelled&) {
      return;
    } catch (const std::exception& e) {
      std::lock_guard<std::mutex> lock(mu);
      if (error.empty()) error = e.what();
      return;
    }
    // Each cell's share of the time (the costs record seconds per cell), cold and warm.
    const double cells_in_batch = static_cast<double>(b.cells.size());
    CellTiming timing;
    timing.seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() /
        cells_in_batch;
    timing.build_seconds = rep.exact_build_seconds / cells_in_batch;
    if (rep.results.empty()) {
      std::lock_guard<std::mutex> lock(mu);
      for (size_t c : b.cells) in_flight.erase(c);
      continue;
    }
    post_results(rep, b.cells, timing);
  }
}

}  // namespace

std::shared_ptr<GridReport> run_grid_job(
    const GridJob& job, JobContext& ctx,
    const std::function<void(const GridJob::Need&, const HeadEval&, const CellTiming&)>& cell_done,
    const std::function<void(std::shared_ptr<const GridReport>)>& report) {
  GridRun run(job, ctx, cell_done, report);
  ctx.progress(run.done, run.total);
  if (run.pending.empty()) return assemble_grid(job, run.cells);
  run.plan_threads();
  {
    std::lock_guard<std::mutex> lock(run.mu);
    run.report_time_left();  // before any cell: the cost model's classes
  }
  // Each of the threads takes the best-ranked pending cell in turn (work), so the loop is one
  // task per thread rather than one per cell.
  parallel_for(run.grid_threads, run.grid_threads, nullptr, [&](int) { run.work(); });
  ctx.check_cancel();
  if (!run.error.empty()) throw InputError(run.error);
  return assemble_grid(job, run.cells);
}

}  // namespace kvscope::app
