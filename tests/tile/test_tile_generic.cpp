// The tile-layer test bodies instantiated for the generic backend (no ISA flags).
#include "tile/tile_test_body.hpp"

DSK_TILE_TEST_DEFINE_RUNNERS(generic)
