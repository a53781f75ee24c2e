#include "pipeflow/nn/shape_captions.h"

#include <algorithm>
#include <cstdlib>

#include "pipeflow/nn/random.h"

namespace pipeflow::nn {
namespace {

// Whether pixel (y, x) of the 7 × 7 box is part of the shape.
bool inside(int shape, int y, int x) {
  const int centre = ShapeCaptions::kShapeSize / 2;
  const int dy = y - centre, dx = x - centre;
  switch (shape) {
    case 0:  // square
      return true;
    case 1:  // circle of radius 3.5
      return 4 * (dx * dx + dy * dy) <= 49;
    case 2:  // triangle, apex up: row y is 2·(y/2) + 1 pixels wide
      return 2 * std::abs(dx) <= y;
    default:  // cross, bars 3 pixels thick
      return std::abs(dx) <= 1 || std::abs(dy) <= 1;
  }
}

}  // namespace

ShapeCaptions::Sample ShapeCaptions::sample(Split split, std::int64_t step, std::int64_t index) const {
  std::uint64_t seed = derive_seed(seed_, split == Split::kTrain ? 0 : 1);
  seed = derive_seed(derive_seed(seed, static_cast<std::uint64_t>(step)), static_cast<std::uint64_t>(index));
  Rng rng(seed);
  Sample s;
  s.colour = static_cast<int>(rng.below(kColours.size()));
  s.shape = static_cast<int>(rng.below(kShapes.size()));
  s.row = static_cast<int>(rng.below(kImageSize - kShapeSize + 1));
  s.column = static_cast<int>(rng.below(kImageSize - kShapeSize + 1));
  return s;
}

void ShapeCaptions::draw(const Sample& sample, std::span<float> pixels) {
  // RGB of red, green, blue, yellow.
  static constexpr float kRgb[4][3] = {{1, 0, 0}, {0, 1, 0}, {0, 0, 1}, {1, 1, 0}};
  std::fill(pixels.begin(), pixels.end(), 0.0f);
  const int plane = kImageSize * kImageSize;
  for (int y = 0; y < kShapeSize; ++y) {
    for (int x = 0; x < kShapeSize; ++x) {
      if (!inside(sample.shape, y, x)) continue;
      const int at = (sample.row + y) * kImageSize + sample.column + x;
      for (int c = 0; c < kChannels; ++c) pixels[static_cast<std::size_t>(c * plane + at)] = kRgb[sample.colour][c];
    }
  }
}

std::string ShapeCaptions::caption(const Sample& sample) {
  std::string text = "a ";
  text += kColours[static_cast<std::size_t>(sample.colour)];
  text += ' ';
  text += kShapes[static_cast<std::size_t>(sample.shape)];
  text.resize(kCaptionBytes, '.');
  return text;
}

ShapeCaptions::Batch ShapeCaptions::batch(Split split, std::int64_t step, std::int64_t first, int count,
                                          Allocator allocator) const {
  Batch out{Tensor::uninitialized({count, kChannels, kImageSize, kImageSize}, allocator),
            IntTensor::uninitialized({count, kCaptionBytes}, allocator),
            IntTensor::uninitialized({count, kCaptionBytes}, allocator)};
  const std::size_t image = kChannels * kImageSize * kImageSize;
  for (int i = 0; i < count; ++i) {
    const Sample s = sample(split, step, first + i);
    draw(s, out.images.span().subspan(i * image, image));
    const std::string text = caption(s);
    std::int32_t* tokens = out.tokens.data() + static_cast<long>(i) * kCaptionBytes;
    std::int32_t* targets = out.targets.data() + static_cast<long>(i) * kCaptionBytes;
    tokens[0] = kStartToken;
    for (int j = 0; j < kCaptionBytes; ++j) {
      targets[j] = static_cast<unsigned char>(text[static_cast<std::size_t>(j)]);
      if (j + 1 < kCaptionBytes) tokens[j + 1] = targets[j];
    }
  }
  return out;
}

}  // namespace pipeflow::nn
