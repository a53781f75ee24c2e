#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "pipeflow/model/model_spec.h"

namespace pipeflow {

// The rules that tie a layout's counts together, written once: the run
// configuration checks its keys with them (resolve()) and validate_layout
// (sim/layout.h) a layout built in code. Messages use the keys' names.

// The product of positive counts that must fit an int (devices, sequences
// per step). Throws Error "<what> = a × b × c: more than 2147483647 <unit>:
// use smaller sizes" when it does not, instead of wrapping around.
int checked_product(std::initializer_list<int> factors, std::string_view what, std::string_view unit);

// The multiples of `unit` nearest `value`, for an error's fix: "984 or 1008"
// (just `unit` when value < unit).
std::string nearest_multiples(int value, int unit);

// Megatron's sequence parallelism splits the sequence over the t
// tensor-parallel ranks: with t > 1, seq_length must be a multiple of t.
// Throws Error "seq_length 1001 is not a multiple of tensor_parallel 8: ..."
// with the nearest lengths as the fix.
void check_sequence_parallel_split(int seq_length, int tensor_parallel);

// devices = tensor_parallel × stages × data_parallel; Throws Error naming
// both sides and the fix.
void check_device_count(int devices, int tensor_parallel, int stages, int data_parallel);

// The micro-batches of a step at their own shapes: variable_seq_lengths
// and variable_images (empty: every micro-batch at seq_length and the
// model's images), each list repeated over the `microbatches` of a step.
// Every length in [1, seq_length] (seq_length is the longest, what the
// buffers are sized for) and, with sequence parallelism over
// `sequence_parallel_ranks` (1: none), a multiple of them; images only for
// a model with a vision tower, and each micro-batch's image tokens below
// its length (the text needs a position). Throws Error naming the key, the
// value, the rule and the fix.
void check_microbatch_shapes(const std::vector<int>& lengths, const std::vector<int>& images, int seq_length,
                             const ModelSpec& model, int microbatches, int sequence_parallel_ranks);

}  // namespace pipeflow
