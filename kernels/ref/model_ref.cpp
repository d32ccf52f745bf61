// Plain-loop reference of the model ops (see model_ref.hpp and kernels/ops.hpp for the math).
#include "ref/model_ref.hpp"

#include <cmath>
#include <limits>

namespace ctxpar::ref {

template <class T>
void rmsnorm_fwd(const T* x, const T* w, T* y, T* rstd, int64_t rows, int64_t dim, T eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    T ss = 0;
    for (int64_t j = 0; j < dim; ++j) ss += xr[j] * xr[j];
    const T rs = T(1) / std::sqrt(ss / T(dim) + eps);
    rstd[r] = rs;
    for (int64_t j = 0; j < dim; ++j) y[r * dim + j] = xr[j] * rs * w[j];
  }
}

template <class T>
void rmsnorm_bwd(const T* dy, const T* x, const T* w, const T* rstd, T* dx, T* dw, int64_t rows, int64_t dim) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = x + r * dim;
    const T* dyr = dy + r * dim;
    const T rs = rstd[r];
    // d/dx of y_j = x_j rs w_j with rs = (mean x^2 + eps)^(-1/2): d rs / d x_k = -rs^3 x_k / dim.
    T dot = 0;  // sum_j dy_j w_j xh_j
    for (int64_t j = 0; j < dim; ++j) dot += dyr[j] * w[j] * xr[j] * rs;
    for (int64_t j = 0; j < dim; ++j) {
      const T xh = xr[j] * rs;
      dx[r * dim + j] += rs * (dyr[j] * w[j] - xh * dot / T(dim));
      dw[j] += dyr[j] * xh;
    }
  }
}

template <class T>
void rope_apply(T* x, int64_t rows, int32_t H, int32_t D, const int64_t* pos, const double* inv_freq, bool inverse) {
  const int32_t half = D / 2;
  for (int64_t r = 0; r < rows; ++r)
    for (int32_t h = 0; h < H; ++h) {
      T* xr = x + (r * H + h) * D;
      for (int32_t i = 0; i < half; ++i) {
        const double ang = double(pos[r]) * inv_freq[i];
        const T c = T(std::cos(ang)), s = T(inverse ? -std::sin(ang) : std::sin(ang));
        const T a = xr[i], b = xr[i + half];
        xr[i] = a * c - b * s;
        xr[i + half] = a * s + b * c;
      }
    }
}

template <class T> void swiglu_fwd(const T* g, const T* u, T* h, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    h[i] = g[i] * s * u[i];
  }
}

template <class T> void swiglu_bwd(const T* dh, const T* g, const T* u, T* dg, T* du, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const T s = T(1) / (T(1) + std::exp(-g[i]));
    const T silu = g[i] * s;
    const T dsilu = s * (T(1) + g[i] * (T(1) - s));
    const T d = dh[i];
    dg[i] = d * u[i] * dsilu;
    du[i] = d * silu;
  }
}

template <class T>
double cross_entropy_fwd_bwd(const T* logits, const int32_t* labels, int64_t rows, int64_t V, T grad_scale, T* dlogits) {
  double loss = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const T* z = logits + r * V;
    T* dz = dlogits + r * V;
    if (labels[r] < 0) {
      for (int64_t j = 0; j < V; ++j) dz[j] = 0;
      continue;
    }
    T m = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < V; ++j) m = z[j] > m ? z[j] : m;
    T sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(z[j] - m);
    const T lse = m + std::log(sum);
    loss += double(lse - z[labels[r]]);
    const int32_t y = labels[r];
    for (int64_t j = 0; j < V; ++j) dz[j] = grad_scale * (std::exp(z[j] - lse) - (j == y ? T(1) : T(0)));
  }
  return loss;
}

template <class T>
void adamw_update(T* p, const T* g, T* m, T* v, int64_t n, double lr, double beta1, double beta2, double eps,
                  double weight_decay, double grad_scale, int64_t step) {
  const T bc1 = T(1) - T(std::pow(beta1, double(step)));
  const T bc2 = T(1) - T(std::pow(beta2, double(step)));
  for (int64_t i = 0; i < n; ++i) {
    const T gi = T(grad_scale) * g[i];
    m[i] = T(beta1) * m[i] + (T(1) - T(beta1)) * gi;
    v[i] = T(beta2) * v[i] + (T(1) - T(beta2)) * gi * gi;
    p[i] *= T(1) - T(lr) * T(weight_decay);
    const T denom = std::sqrt(v[i]) / std::sqrt(bc2) + T(eps);
    p[i] -= T(lr) / bc1 * m[i] / denom;
  }
}

#define CTXPAR_MODEL_REF(T)                                                                                   \
  template void rmsnorm_fwd<T>(const T*, const T*, T*, T*, int64_t, int64_t, T);                              \
  template void rmsnorm_bwd<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t);             \
  template void rope_apply<T>(T*, int64_t, int32_t, int32_t, const int64_t*, const double*, bool);            \
  template void swiglu_fwd<T>(const T*, const T*, T*, int64_t);                                               \
  template void swiglu_bwd<T>(const T*, const T*, const T*, T*, T*, int64_t);                                 \
  template double cross_entropy_fwd_bwd<T>(const T*, const int32_t*, int64_t, int64_t, T, T*);                \
  template void adamw_update<T>(T*, const T*, T*, T*, int64_t, double, double, double, double, double, double, \
                                int64_t);
CTXPAR_MODEL_REF(float)
CTXPAR_MODEL_REF(double)
#undef CTXPAR_MODEL_REF

}  // namespace ctxpar::ref
