// Student's t distribution: the intervals of the Theory view's fitted exponents and of a capture
// set's means across prompts (docs/theory.md, docs/evaluation.md "Capture sets").
#pragma once

namespace kvscope {

// The p-quantile of Student's t with `dof` >= 1 degrees of freedom (bisection on the CDF written
// with the regularised incomplete beta function, to 1e-12 of the quantile); NaN for dof < 1 or p
// outside (0, 1).
double student_t_quantile(double p, int dof);
double student_t_cdf(double t, int dof);

}  // namespace kvscope
