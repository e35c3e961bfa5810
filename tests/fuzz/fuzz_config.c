/* fuzz_config.c - kvt_config_load_json on arbitrary bytes (config files are
 * untrusted input). Beyond "no crash, leak or UB" it checks the contract:
 * a failure has a message and leaves the config unchanged; a success leaves
 * every option readable, and each value read back sets without error. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "kvtier.h"

#define VALUE_MAX 4096

static void snapshot(const kvt_config *cfg, char (*out)[VALUE_MAX], size_t n)
{
    for (size_t i = 0; i < n; i++) {
        kvt_option_info o;
        if (kvt_config_option(i, &o) != KVT_OK) abort();
        if (kvt_config_get(cfg, o.name, out[i], VALUE_MAX) != KVT_OK) abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    enum { MAX_OPTIONS = 64 };
    static char before[MAX_OPTIONS][VALUE_MAX], after[MAX_OPTIONS][VALUE_MAX];
    size_t n = kvt_config_option_count();
    if (n > MAX_OPTIONS) abort();

    kvt_config *cfg = NULL;
    if (kvt_config_create(&cfg) != KVT_OK) abort();
    snapshot(cfg, before, n);
    kvt_status st = kvt_config_load_json(cfg, (const char *)data, size);
    if (st != KVT_OK && (st != KVT_EINVAL || kvt_last_error()[0] == '\0')) abort();
    snapshot(cfg, after, n);
    if (st != KVT_OK) {
        for (size_t i = 0; i < n; i++) /* all-or-nothing */
            if (strcmp(before[i], after[i]) != 0) abort();
    } else {
        for (size_t i = 0; i < n; i++) {
            kvt_option_info o;
            if (kvt_config_option(i, &o) != KVT_OK) abort();
            if (kvt_config_set(cfg, o.name, after[i]) != KVT_OK) abort(); /* get -> set */
        }
    }
    kvt_config_destroy(cfg);
    return 0;
}
