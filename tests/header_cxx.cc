// The public header compiles as C++ and its enum and handles are usable.
#include "kvtier.h"
#include <cstdio>
#include <cstring>

int main()
{
    if (std::strcmp(kvt_strerror(KVT_EINVAL), "invalid argument") != 0) return 1;
    kvt_config *cfg = nullptr;
    if (kvt_config_create(&cfg) != KVT_OK) return 1;
    kvt_config_destroy(cfg);
    kvt_geometry_destroy(nullptr);
    kvt_client_detach(nullptr);
    kvt_server_destroy(nullptr);
    if (kvt_version() != KVT_VERSION_HEX) return 1;
    std::puts("1 passed, 0 failed");
    return 0;
}
