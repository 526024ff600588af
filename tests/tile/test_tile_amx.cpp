// The tile-layer test bodies instantiated for the amx backend (built with the AMX flags; run only
// where dsk::backend_supported(Backend::amx)).
#include "tile/tile_test_body.hpp"

DSK_TILE_TEST_DEFINE_RUNNERS(amx)
