// The CAF unit-test runner's main() for every protocol suite in this folder.
#include <caf/test/unit_test_impl.hpp>
