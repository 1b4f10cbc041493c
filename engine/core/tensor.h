// Dense matrices the whole engine shares. Rows are tokens, columns are features.
#pragma once

#include <Eigen/Dense>

namespace kvscope {

using MatrixF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using MatrixD = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using VectorF = Eigen::VectorXf;
using VectorD = Eigen::VectorXd;

}  // namespace kvscope
