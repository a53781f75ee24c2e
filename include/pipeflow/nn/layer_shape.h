#pragma once

namespace pipeflow::nn {

// The dimensions of one micro-batch passing through a layer: b sequences of
// t positions, c features in nh heads, v vocabulary entries.
struct LayerShape {
  int b = 0;
  int t = 0;
  int c = 0;
  int nh = 0;
  int v = 0;

  int rows() const { return b * t; }
};

}  // namespace pipeflow::nn
