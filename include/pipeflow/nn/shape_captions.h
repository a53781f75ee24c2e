#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "pipeflow/nn/byte_dataset.h"
#include "pipeflow/tensor/tensor.h"

namespace pipeflow::nn {

// Captioned images for a vision-language model, generated: a 16 × 16 RGB
// image, black, with one filled shape of 7 × 7 pixels (square, circle,
// triangle or cross) in one colour (red, green, blue or yellow: 16 classes)
// at a random place, captioned "a <colour> <shape>." and padded with '.' to
// kCaptionBytes. Text is bytes (vocabulary 256). A sample is a pure function
// of (seed, split, step, index), as ByteDataset's: the validation split is
// drawn from another stream of the same distribution, so its images are
// held out (a position and class it shares with a training image is chance).
//
// The model reads the image, then the text: tokens = '\n' followed by the
// caption's first kCaptionBytes − 1 bytes, targets = the caption (each token's
// next byte).
//
// Thread safety: immutable; any thread may sample.
class ShapeCaptions {
 public:
  static constexpr int kImageSize = 16;
  static constexpr int kChannels = 3;
  static constexpr int kShapeSize = 7;
  static constexpr int kCaptionBytes = 18;  // "a yellow triangle."
  static constexpr std::int32_t kStartToken = '\n';
  static constexpr std::array<std::string_view, 4> kColours = {"red", "green", "blue", "yellow"};
  static constexpr std::array<std::string_view, 4> kShapes = {"square", "circle", "triangle", "cross"};

  struct Sample {
    int colour = 0;  // index into kColours
    int shape = 0;   // index into kShapes
    int row = 0;     // the shape's top-left pixel
    int column = 0;
  };

  // A micro-batch: images [B, 3, 16, 16] in [0, 1], tokens and targets [B, T_c].
  struct Batch {
    Tensor images;
    IntTensor tokens;
    IntTensor targets;
  };

  explicit ShapeCaptions(std::uint64_t seed) : seed_(seed) {}

  Sample sample(Split split, std::int64_t step, std::int64_t index) const;
  // The image's 3 × 16 × 16 values, channel by channel.
  static void draw(const Sample& sample, std::span<float> pixels);
  // "a red circle." padded with '.' to kCaptionBytes.
  static std::string caption(const Sample& sample);
  // Samples first … first + count − 1 of step `step`.
  Batch batch(Split split, std::int64_t step, std::int64_t first, int count, Allocator allocator = {}) const;

 private:
  std::uint64_t seed_;
};

}  // namespace pipeflow::nn
