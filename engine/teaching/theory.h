// The papers' scaling claims measured on real heads (docs/theory.md): discrepancy of the
// self-balancing walk against random signs as n grows, error against budget with fitted
// exponents, and the normalised error under both normalisations (BalanceKV Eq. 2, Frobenius;
// SubGen Eq. 3, operator norm). UI-free: the Theory view and `kvscope-cli theory` draw and print
// what run_theory returns.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/student_t.h"
#include "engine/core/tensor.h"
#include "engine/eval/protocol.h"
#include "engine/io/capture.h"
#include "engine/methods/balancekv/balance_walk.h"
#include "engine/methods/method.h"

namespace kvscope {

// ---- Power-law fit. y ~ c * x^slope by ordinary least squares of log y on log x over every
// point with x > 0 and y > 0 (all seeds and heads pooled, each point once). The interval is the
// two-sided Student-t interval slope +- t_{level, N-2} * se(slope), se from the residual variance:
// valid for independent log-normal noise around the line; points of one seed share its draw, so
// on real heads it is a lower bound on the uncertainty (docs/theory.md).
struct PowerFit {
  bool ok = false;                  // at least 3 usable points over 2 distinct x
  double slope = 0, intercept = 0;  // log y = intercept + slope * log x
  double se = 0;                    // standard error of the slope
  double ci_low = 0, ci_high = 0;   // interval for the slope at `level`
  double level = 0.95;
  double r2 = 0;
  int points = 0;
};
PowerFit fit_power_law(const std::vector<double>& x, const std::vector<double>& y,
                       double level = 0.95);
// student_t_quantile and student_t_cdf: engine/core/student_t.h.

// ---- Operator norm (SubGen Eq. 3). ||V_j||_op for the causal prefixes V_j = rows 0..j of V, for
// j = first .. last (inclusive): the square root of the largest eigenvalue of the prefix Gram
// V_j^T V_j, grown one row at a time (eigen-solver for the first, warm-started power iteration
// after, the solver again when it does not converge).
std::vector<double> prefix_operator_norms(const MatrixF& V, int first, int last);
// ||V_j||_F for the same prefixes.
std::vector<double> prefix_frobenius_norms(const MatrixF& V, int first, int last);

// ---- Discrepancy vs n.
enum class DiscSizes {
  Prefixes,     // one walk over the first 2^K tokens of the middle, measured at every prefix 2^k
  WholeBlocks,  // for every k, the first 2^k tokens of the middle walked as one block of their own
};
const char* disc_sizes_name(DiscSizes s);  // "prefixes" | "blocks"

// One parameter set of the practical walk to measure.
struct DiscWalk {
  std::string label;  // "authors' parameters", "unsaturated"
  BalanceParams params;
};

// A curve of mean and spread (min..max) over samples (seeds, and heads when several), with its
// fitted slope on log-log axes.
struct ScalingCurve {
  std::string instance;   // "denominator" | "numerator" (discrepancy); method name (error)
  std::string measure;    // "query" | "kernel" (discrepancy); "relative" | "frobenius" | "operator"
  std::string signs;      // "walk" | "random" (discrepancy); "" (error)
  std::vector<double> x;  // n or budget m
  std::vector<double> mean, lo, hi;
  std::vector<std::vector<double>> samples;  // [point][sample]
  PowerFit fit;
};

struct DiscRun {
  DiscWalk walk;
  // Share of the walk's steps whose p fell outside (0, 1) (or NaN), so the sign was forced: per
  // instance, over every seed, head and size.
  double saturation_denominator = 0, saturation_numerator = 0;
  std::vector<ScalingCurve> curves;  // instance x measure x signs
  const ScalingCurve* find(const std::string& instance, const std::string& measure,
                           const std::string& signs) const;
};

// ---- Error vs budget.
struct TheoryMethod {
  std::string name;
  ParamValues params;
};

struct ErrorScaling {
  std::string method, label;
  std::vector<double> ratios;
  std::vector<int> budgets;          // m = round(ratio * n_mid) of the first head
  std::vector<double> kept;          // mean middle tokens kept (the walk may keep fewer than m)
  std::vector<ScalingCurve> curves;  // measure: relative, frobenius, operator
  std::string note;                  // why some points are missing (refused heads, errors)
  const ScalingCurve* find(const std::string& measure) const;
};

struct TheorySpec {
  std::vector<int> layers, heads;  // empty: all
  // Discrepancy.
  bool want_discrepancy = true;
  DiscSizes sizes = DiscSizes::Prefixes;
  int max_n = 512;  // largest n (a power of two, at most the middle)
  int min_n = 4;
  int disc_seeds = 8;
  int max_queries = 32;  // evaluation queries the query measure averages over (evenly spaced)
  std::vector<DiscWalk> walks;  // empty: default_disc_walks()
  // Error vs budget.
  bool want_error = true;
  std::vector<TheoryMethod> methods;
  std::vector<double> ratios{0.5, 0.25, 0.125, 0.0625, 0.03125};
  int seeds = 5;
  uint64_t base_seed = 0;
  int sink = -1, eval = -1;
  Estimator estimator = Estimator::Weighted;
};

// The authors' parameters (BalanceParams defaults) and the same walk at temp 0.02, gamma 0.1,
// where it is not saturated on the sample captures (docs/theory.md).
std::vector<DiscWalk> default_disc_walks();
// The same two walks with the unsaturated walk at `unsat_temp` and `unsat_gamma` (the CLI's
// --unsat-temp / --unsat-gamma and the Theory view's fields).
std::vector<DiscWalk> disc_walks(double unsat_temp, double unsat_gamma);

struct TheoryResult {
  std::string capture_path;
  CaptureInfo info;
  TheorySpec spec;
  std::string scope;   // "layer 1 kv head 0" or "all 20 heads"
  std::string window;  // EvalWindow::describe() of the first head at the first ratio
  int heads = 0;
  std::vector<int> sizes;  // n of the discrepancy curves
  std::vector<DiscRun> discrepancy;
  std::vector<ErrorScaling> errors;
  std::vector<std::string> notes;
  nlohmann::json to_json() const;
  std::string to_csv() const;  // one row per curve point
};

// Progress: (done, total) work items. `cancel` set: throws Cancelled. Bad specs throw
// SettingError/InputError naming the setting.
using TheoryProgress = std::function<void(int done, int total)>;
TheoryResult run_theory(CaptureFile& capture, const TheorySpec& spec,
                        const TheoryProgress& progress = {},
                        const std::atomic<bool>* cancel = nullptr);

// The discrepancy measurements of one head, exposed for tests: `keys`/`values` are the rows to
// walk (already the middle tokens, in order), `queries` the directions of the query measure.
// Appends one sample per seed to each curve of `run` (curves created on first use).
void measure_discrepancy(const MatrixF& keys, const MatrixF& values,
                         const std::vector<std::vector<float>>& queries,
                         const std::vector<int>& sizes, DiscSizes mode, int seeds,
                         uint64_t base_seed, uint32_t layer, uint32_t head, DiscRun& run,
                         long* saturated = nullptr, long* walked = nullptr);
// (saturated / walked, when given, point to two counters each: [0] denominator, [1] numerator;
// the walks' saturated steps and steps 1.. are added to them.)
// Mean, min, max and fit of every curve from its samples.
void finish_curve(ScalingCurve& c, int min_fit_x = 0);

}  // namespace kvscope
