// main() of every test executable. gtest's own gtest_main archive would bring libgtest.a back
// onto each executable's link line beside gns_gtest (tests/support/CMakeLists.txt).
#include <gtest/gtest.h>

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
