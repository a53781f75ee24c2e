#include "pipeflow/nn/shape_captions.h"

#include <gtest/gtest.h>

#include <array>
#include <vector>

namespace pipeflow::nn {
namespace {

constexpr int kPlane = ShapeCaptions::kImageSize * ShapeCaptions::kImageSize;

std::array<float, 3> channel_sums(const std::vector<float>& pixels) {
  std::array<float, 3> sums{};
  for (int c = 0; c < 3; ++c) {
    for (int i = 0; i < kPlane; ++i) sums[static_cast<std::size_t>(c)] += pixels[static_cast<std::size_t>(c * kPlane + i)];
  }
  return sums;
}

// Pixels of each 7 × 7 shape, counted by hand: the square 49; the circle of
// radius 3.5 all but the 12 cells with dx² + dy² >= 13; the triangle's rows
// 1, 1, 3, 3, 5, 5, 7 = 25; the cross's two 3 × 7 bars less their 3 × 3 overlap = 33.
TEST(ShapeCaptions, ShapesHaveTheirPixelCountsInTheirColour) {
  const std::array<float, 4> counts = {49, 37, 25, 33};
  std::vector<float> pixels(3 * kPlane);
  for (int shape = 0; shape < 4; ++shape) {
    ShapeCaptions::draw({.colour = 3, .shape = shape, .row = 9, .column = 0}, pixels);  // yellow: red + green
    EXPECT_EQ(channel_sums(pixels), (std::array<float, 3>{counts[shape], counts[shape], 0})) << shape;
  }
  ShapeCaptions::draw({.colour = 2, .shape = 2, .row = 0, .column = 9}, pixels);  // a blue triangle, top right
  EXPECT_EQ(pixels[2 * kPlane + 12], 1.0f);  // its apex: row 0, column 9 + 3
  EXPECT_EQ(pixels[2 * kPlane + 11], 0.0f);
  EXPECT_EQ(pixels[2 * kPlane + 6 * 16 + 9], 1.0f);  // its base's left end
}

TEST(ShapeCaptions, CaptionsNameTheColourAndShape) {
  EXPECT_EQ(ShapeCaptions::caption({.colour = 0, .shape = 1}), "a red circle......");
  EXPECT_EQ(ShapeCaptions::caption({.colour = 3, .shape = 2}), "a yellow triangle.");
}

TEST(ShapeCaptions, BatchTokensAreTheCaptionAfterTheStart) {
  const ShapeCaptions data(5);
  const auto batch = data.batch(Split::kTrain, 2, 4, 3);
  ASSERT_EQ(batch.images.shape(), (Shape{3, 3, 16, 16}));
  ASSERT_EQ(batch.tokens.shape(), (Shape{3, ShapeCaptions::kCaptionBytes}));
  for (int i = 0; i < 3; ++i) {
    const std::string caption = ShapeCaptions::caption(data.sample(Split::kTrain, 2, 4 + i));
    const std::int32_t* tokens = batch.tokens.data() + i * ShapeCaptions::kCaptionBytes;
    const std::int32_t* targets = batch.targets.data() + i * ShapeCaptions::kCaptionBytes;
    EXPECT_EQ(tokens[0], '\n');
    for (int j = 0; j < ShapeCaptions::kCaptionBytes; ++j) {
      EXPECT_EQ(targets[j], caption[static_cast<std::size_t>(j)]);
      if (j > 0) {
        EXPECT_EQ(tokens[j], targets[j - 1]);
      }
    }
  }
}

// Samples depend only on (seed, split, step, index); the splits are
// different streams; all 16 classes come up about equally.
TEST(ShapeCaptions, SamplesAreSeededAndSplitsDiffer) {
  const ShapeCaptions data(5);
  int same = 0;
  std::array<int, 16> classes{};
  for (int i = 0; i < 1600; ++i) {
    const auto a = data.sample(Split::kTrain, 0, i);
    const auto b = ShapeCaptions(5).sample(Split::kTrain, 0, i);
    EXPECT_TRUE(a.colour == b.colour && a.shape == b.shape && a.row == b.row && a.column == b.column);
    const auto held_out = data.sample(Split::kValidation, 0, i);
    same += a.colour == held_out.colour && a.shape == held_out.shape && a.row == held_out.row &&
            a.column == held_out.column;
    ++classes[static_cast<std::size_t>(a.colour * 4 + a.shape)];
  }
  EXPECT_LT(same, 16);  // chance: 1600 / (16 · 100 positions) = 1
  for (const int count : classes) EXPECT_TRUE(count > 60 && count < 140) << count;
}

}  // namespace
}  // namespace pipeflow::nn
