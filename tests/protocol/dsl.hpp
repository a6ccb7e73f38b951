#pragma once
// CAF 0.17.6's caf/test/dsl.hpp calls FAIL(...) in its request helper but
// never defines it; map it to CAF_FAIL before including the DSL.
#include <caf/test/unit_test.hpp>
#ifndef FAIL
#define FAIL(msg) CAF_FAIL(msg)
#endif
#include <caf/test/dsl.hpp>
