// The teaching walk of the Walk view (docs/app.md): a handful of user vectors in 2-D,
// signed one at a time, with the table the authors' talk draws (balancekv-talk.md): <u_i, z>,
// the signs, the probabilities and the prefix sums.
//
// Two rules:
//  - KnownDirection: z is known, so each sign is chosen to pull the prefix sum along z back
//    towards 0: sigma_j = - when the prefix P = <sum_{i<j} sigma_i u_i, z> and <u_j, z> have the
//    same sign, + otherwise (so sigma_1 = +). Then |P + sigma_j <u_j,z>| = ||P| - |<u_j,z>||, so
//    when every |<u_i, z>| <= 1 every prefix stays within 1 (the talk's proposition). This is
//    the talk's worked example (all projections positive: minus exactly when the prefix is).
//  - SelfBalancing: the Alweiss-Liu-Sawhney walk that needs no z: w_j = sum_{i<j} sigma_i u_i,
//    p_j = 1/2 - <w_j, u_j> / (2c), sigma_j = + with probability p_j (clipped to [0, 1]); the
//    uniforms come from counter_uniform(seed, kRandMisc, 0, 0, 0, 0xFEED, j).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvscope {

class TeachingWalk {
 public:
  enum class Rule { KnownDirection, SelfBalancing };
  using Vec2 = std::array<double, 2>;

  struct Step {
    int index = 0;        // 0-based position of the vector
    Vec2 u{0, 0};         // the vector
    double along_z = 0;   // <u, z>
    double inner = 0;     // SelfBalancing: <w, u> with w the prefix sum before this step;
                          // KnownDirection: the prefix along z before this step
    double p = 0.5;       // probability of sigma = + (before clipping; 1 or 0 when chosen)
    double uniform = -1;  // the uniform drawn (SelfBalancing only, else -1)
    int sigma = +1;
    Vec2 prefix{0, 0};          // sum_{i<=j} sigma_i u_i
    double prefix_along_z = 0;  // <prefix, z>
  };

  // Throws InputError when `vectors` is empty, z is zero or c <= 0.
  TeachingWalk(std::vector<Vec2> vectors, Vec2 z, Rule rule, double c = 1.0, uint64_t seed = 0);

  // The talk's worked example: scalars 0.1, 0.8, 0.5, 0.7, 0.3 along z = (1, 0), known-direction
  // rule; signs + - + + -, prefix sums along z 0.1, -0.7, -0.2, 0.5, 0.2. The vectors get
  // perpendicular parts 0.9, 0.45, -0.45, -0.85, 0.3 so that they fan out in the plane.
  static TeachingWalk talk_example();

  // Signs the next vector; false when every vector is already signed.
  bool step();
  void run();    // step() until done
  void reset();  // back to no signed vectors (the same draws replay)
  bool done() const { return steps_.size() == vectors_.size(); }

  const std::vector<Vec2>& vectors() const { return vectors_; }
  const std::vector<Step>& steps() const { return steps_; }  // the signed ones, in order
  Vec2 z() const { return z_; }
  Rule rule() const { return rule_; }
  double c() const { return c_; }
  // max_j |prefix along z| so far (what the proposition bounds).
  double max_abs_prefix_along_z() const;

  // The talk's table for the steps so far: one column per vector, rows <u_i,z>, sigma, p and
  // the prefix sums along z.
  std::string table() const;

 private:
  std::vector<Vec2> vectors_;
  Vec2 z_;
  Rule rule_;
  double c_;
  uint64_t seed_;
  std::vector<Step> steps_;
};

}  // namespace kvscope
