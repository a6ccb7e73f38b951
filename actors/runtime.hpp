#pragma once
// transitional: removed when coordinator.cpp moves (it and metrics.cpp still
// include actors/runtime.hpp; the spawn functions are in actors/spawn.hpp).
#include "actors/spawn.hpp"
