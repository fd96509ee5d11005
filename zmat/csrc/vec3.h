// 3-vectors as pointers to three values: the kernels' cross and dot products.
#pragma once

namespace zmat {

template <typename A>
inline void cross(const A* u, const A* v, A* o) {
  o[0] = u[1] * v[2] - u[2] * v[1];
  o[1] = u[2] * v[0] - u[0] * v[2];
  o[2] = u[0] * v[1] - u[1] * v[0];
}
template <typename A>
inline A dot(const A* u, const A* v) {
  return u[0] * v[0] + u[1] * v[1] + u[2] * v[2];
}

}  // namespace zmat
