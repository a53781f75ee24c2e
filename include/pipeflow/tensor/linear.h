#pragma once

namespace pipeflow {

// The affine layer of GPT-2 (Hugging Face's Conv1D): weights in [in, out]
// layout. Dimension letters: n rows (tokens), in and out features.
// All pointers are to dense row-major arrays; outputs must not alias inputs.

// y[n, out] = x[n, in] · w[in, out] + b[out] (+ residual[n, out]; b and
// residual each left out when null): for float, a bias without a residual
// goes to gemm_bias (under kBf16 the matmul adds it; otherwise it is written
// first too); else the bias and the residual are written first and the
// product adds onto them.
template <class T>
void linear_forward(T* y, const T* x, const T* w, const T* b, const T* residual, int n, int in, int out);

// The same with w in panels (pack_panels in panels.h): for products of few
// rows; each row's result does not depend on the others.
template <class T>
void linear_forward_panels(T* y, const T* x, const T* w_panels, const T* b, const T* residual, int n, int in,
                           int out);

// The input part of the backward (I): dx[n, in] = dy[n, out] · wᵀ (overwrites dx).
template <class T>
void linear_backward_input(T* dx, const T* dy, const T* w, int n, int in, int out);

// The weight part of the backward (W), accumulating:
// dw[in, out] += xᵀ · dy, db[out] += Σ_rows dy (unless db is null).
template <class T>
void linear_backward_weight(T* dw, T* db, const T* x, const T* dy, int n, int in, int out);

// db[out] += Σ_rows dy[n, out].
template <class T>
void add_column_sums(T* db, const T* dy, int n, int out);

// torch.nn.Linear's layout without bias, as Llama's projections: w [out, in].
// y and dy may be column blocks of a wider tensor (row stride ldy), so that q,
// k and v (or gate and up) land side by side in one packed tensor.

// y[n, out] = x[n, in] · wᵀ (+ residual[n, out], dense, if not null).
template <class T>
void projection_forward(T* y, int ldy, const T* x, const T* w, const T* residual, int n, int in, int out);

// I: dx[n, in] = dy · w, or dx += dy · w when `accumulate` (the sum over
// projections that read the same input).
template <class T>
void projection_backward_input(T* dx, const T* dy, int ldy, const T* w, int n, int in, int out, bool accumulate);

// W, accumulating: dw[out, in] += dyᵀ · x.
template <class T>
void projection_backward_weight(T* dw, const T* x, const T* dy, int ldy, int n, int in, int out);

}  // namespace pipeflow
