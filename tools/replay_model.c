/* replay_model.c - model and size options of `kvtier replay` and `plan`. */
#include "replay.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"

int parse_gib(const char *cmd, const char *opt, const char *v, double min, double max, double *out)
{
    char *end = NULL;
    double d = v ? strtod(v, &end) : NAN;
    if (!v || end == v || *end != '\0' || !isfinite(d) || d < min || d > max) {
        fprintf(stderr, "kvtier %s: %s: \"%s\" is not a size in GiB between %g and %g\n", cmd,
                opt, v ? v : "", min, max);
        return -1;
    }
    *out = d;
    return 0;
}

int parse_count(const char *cmd, const char *opt, const char *v, uint64_t min, uint64_t max,
                uint64_t *out)
{
    uint64_t n = 0;
    if (!v || !demo_parse_u64(v, &n) || n < min || n > max) {
        fprintf(stderr, "kvtier %s: %s: \"%s\" is not a whole number in %llu..%llu\n", cmd, opt,
                v ? v : "", (unsigned long long)min, (unsigned long long)max);
        return -1;
    }
    *out = n;
    return 0;
}

/* Bounds of a custom geometry: those of kvt_geometry (KVT_MAX_LAYERS) and
 * sane per-layer sizes, so bytes per block stays far below 2^63. */
static int custom_opt(model_opts *m, const char *cmd, const char *a, const char *v)
{
    struct { const char *name; uint64_t *field, max; } f[] = {
        {"--layers", &m->layers, KVT_MAX_LAYERS}, {"--kv-heads", &m->kv_heads, 1024},
        {"--head-dim", &m->head_dim, 65536}, {"--elem-size", &m->elem_size, 8},
    };
    for (size_t k = 0; k < sizeof f / sizeof f[0]; k++) {
        if (strcmp(a, f[k].name) != 0) continue;
        if (parse_count(cmd, a, v, 1, f[k].max, f[k].field)) return -1;
        m->custom = true;
        return 1;
    }
    return 0;
}

int model_parse_opt(model_opts *m, const char *cmd, int argc, char **argv, int *i)
{
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!strcmp(a, "--mla")) return m->mla = m->custom = true, 1;
    bool takes = !strcmp(a, "--model") || !strcmp(a, "--layers") || !strcmp(a, "--kv-heads") ||
                 !strcmp(a, "--head-dim") || !strcmp(a, "--elem-size");
    if (!takes) return 0;
    if (!v) return cli_bad_arg(cmd, a, true), -1;
    (*i)++;
    if (!strcmp(a, "--model")) return m->model = v, 1;
    return custom_opt(m, cmd, a, v);
}

int model_check(model_opts *m, const char *cmd)
{
    if (m->custom && m->model) {
        fprintf(stderr, "kvtier %s: give --model or a custom geometry (--layers, --kv-heads, "
                "--head-dim, --elem-size, --mla), not both\n", cmd);
        return -1;
    }
    if (m->custom) {
        if (!m->layers || !m->kv_heads || !m->head_dim || !m->elem_size) {
            fprintf(stderr, "kvtier %s: a custom geometry needs --layers, --kv-heads, "
                    "--head-dim and --elem-size\n", cmd);
            return -1;
        }
        uint64_t e = m->elem_size;
        if (e != 1 && e != 2 && e != 4 && e != 8) {
            fprintf(stderr, "kvtier %s: --elem-size %llu: must be 1, 2, 4 or 8\n", cmd,
                    (unsigned long long)e);
            return -1;
        }
        return 0;
    }
    if (!m->model) m->model = "llama3-8b";
    const char *ok[] = {"llama3-8b", "llama3-70b", "deepseek-v3"};
    for (size_t k = 0; k < 3; k++)
        if (!strcmp(m->model, ok[k])) return 0;
    fprintf(stderr, "kvtier %s: --model \"%s\": known models are llama3-8b, llama3-70b and "
            "deepseek-v3 (or give a custom geometry)\n", cmd, m->model);
    return -1;
}

kvt_status model_geometry(const model_opts *m, uint32_t tokens_per_page, kvt_geometry **out)
{
    if (!m->custom) return kvt_geometry_preset(out, m->model, tokens_per_page, 1);
    kvt_status st = kvt_geometry_create(out, (uint32_t)m->layers, tokens_per_page,
                                        KVT_LAYOUT_LAYER_FIRST);
    if (st) return st;
    kvt_component_spec c = {(uint32_t)m->kv_heads, (uint32_t)m->head_dim, (uint32_t)m->elem_size};
    kvt_layer_spec s = {.num_components = m->mla ? 1 : 2, .component = {c, c}};
    st = kvt_geometry_set_layers(*out, 0, (uint32_t)m->layers, &s);
    if (st) {
        kvt_geometry_destroy(*out);
        *out = NULL;
    }
    return st;
}

uint64_t model_block_bytes(const model_opts *m, const char *cmd)
{
    kvt_geometry *g = NULL;
    kvt_geometry_info info = {0};
    kvt_status st = model_geometry(m, 16, &g);
    if (!st) st = kvt_geometry_info_get(g, &info);
    kvt_geometry_destroy(g);
    if (st) {
        fprintf(stderr, "kvtier %s: geometry: %s: %s\n", cmd, kvt_strerror(st), kvt_last_error());
        return 0;
    }
    return info.bytes_per_token * TRACE_BLOCK_TOKENS;
}

const char *model_name(const model_opts *m) { return m->custom ? "custom" : m->model; }
