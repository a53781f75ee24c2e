#include "../support/relative_error.h"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace pipeflow {
namespace {

using testing::relative_error;

TEST(RelativeError, IsTheNormOfTheDifferenceOverTheReferencesNorm) {
  const std::vector<float> reference = {3, 4};
  EXPECT_DOUBLE_EQ(relative_error(std::vector<float>{3, 4}, reference), 0);
  EXPECT_DOUBLE_EQ(relative_error(std::vector<float>{3, 5}, reference), 1.0 / 5);
  EXPECT_DOUBLE_EQ(relative_error(std::vector<float>{1, 0}, std::vector<float>{0, 0}), 1);  // zero reference: ‖a‖
}

// Before, a longer tensor whose head matched compared equal and a shorter one
// was read past its end.
TEST(RelativeError, TensorsOfDifferentSizesFailTheTest) {
  const std::vector<float> reference = {1, 2};
  double error = 0;
  EXPECT_NONFATAL_FAILURE(error = relative_error(std::vector<float>{1, 2, 99}, reference),
                          "relative_error compares 3 values with a reference of 2");
  EXPECT_TRUE(std::isinf(error));
  EXPECT_NONFATAL_FAILURE(error = relative_error(std::vector<float>{1}, reference),
                          "relative_error compares 1 values with a reference of 2");
  EXPECT_TRUE(std::isinf(error));
}

}  // namespace
}  // namespace pipeflow
