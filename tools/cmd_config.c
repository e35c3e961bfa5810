/* cmd_config.c - `kvtier config --dump`: every option with its value as
 * the library would see it here (defaults, then --file, then KVTIER_*
 * variables), its default, environment variable, type and help. */
#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cmds.h"
#include "kvtier.h"
#include "util/parse.h"

#define VALUE_MAX 4096

static int usage(FILE *to)
{
    fprintf(to,
            "usage: kvtier config --dump [--json] [--file F]\n"
            "\n"
            "Prints every option: its current value (defaults, then the JSON file F,\n"
            "then KVTIER_* environment variables), default, environment variable,\n"
            "type and help. Sizes are shown in exact bytes.\n"
            "\n"
            "  --dump      print the options (required)\n"
            "  --json      one JSON object {\"options\": [...]} instead of a table\n"
            "  --file F    apply the JSON object in file F before the environment\n"
            "  --help      this text\n");
    return to == stdout ? 0 : 2;
}

typedef struct config_args {
    bool dump, json;
    const char *file;
} config_args;

/* 0: parsed; 1: --help printed; 2: bad arguments (reported). */
static int parse_args(config_args *a, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "--help") || !strcmp(s, "-h")) {
            usage(stdout);
            return 1;
        } else if (!strcmp(s, "--dump")) {
            a->dump = true;
        } else if (!strcmp(s, "--json")) {
            a->json = true;
        } else if (!strcmp(s, "--file")) {
            if (i + 1 >= argc) return cli_bad_arg("config", s, true);
            a->file = argv[++i];
        } else if (!strncmp(s, "--file=", 7)) {
            a->file = s + 7;
        } else {
            return cli_bad_arg("config", s, false);
        }
    }
    if (!a->dump) {
        fprintf(stderr, "kvtier config: nothing to do (did you mean --dump?)\n");
        return usage(stderr);
    }
    return 0;
}

static int fail(kvt_status st)
{
    fprintf(stderr, "kvtier config: %s: %s\n", kvt_strerror(st), kvt_last_error());
    return 2;
}

static kvt_status build_config(kvt_config **out, const char *file)
{
    kvt_config *cfg = NULL;
    kvt_status st = kvt_config_create(&cfg);
    if (st) return st;
    if (file) st = kvt_config_load_file(cfg, file);
    if (!st) st = kvt_config_load_env(cfg);
    if (st) {
        kvt_config_destroy(cfg);
        return st;
    }
    *out = cfg;
    return KVT_OK;
}

static int dump_json(const kvt_config *cfg)
{
    cJSON *root = cJSON_CreateObject();
    cJSON *list = root ? cJSON_AddArrayToObject(root, "options") : NULL;
    bool ok = list != NULL;
    for (size_t i = 0; ok && i < kvt_config_option_count(); i++) {
        kvt_option_info o;
        char value[VALUE_MAX];
        kvt_status st = kvt_config_option(i, &o);
        if (!st) st = kvt_config_get(cfg, o.name, value, sizeof value);
        if (st) {
            cJSON_Delete(root);
            return fail(st);
        }
        cJSON *item = cJSON_CreateObject();
        ok = item && cJSON_AddItemToArray(list, item) &&
             cJSON_AddStringToObject(item, "name", o.name) &&
             cJSON_AddStringToObject(item, "value", value) &&
             cJSON_AddStringToObject(item, "default", o.default_value) &&
             cJSON_AddStringToObject(item, "env", o.env) &&
             cJSON_AddStringToObject(item, "type", o.type) &&
             cJSON_AddStringToObject(item, "help", o.help);
    }
    char *text = ok ? cJSON_Print(root) : NULL;
    cJSON_Delete(root);
    if (!text) {
        fprintf(stderr, "kvtier config: out of memory formatting JSON\n");
        return 2;
    }
    puts(text);
    cJSON_free(text);
    return 0;
}

/* An empty string shows as "" so that the columns stay readable. */
static const char *shown(const char *s) { return s[0] ? s : "\"\""; }

/* The value column: exact, plus a readable form for sizes. */
static void shown_value(const kvt_option_info *o, const char *value, char *buf, size_t len)
{
    uint64_t bytes;
    if (strcmp(o->type, "size") == 0 && kvt__parse_size(value, &bytes) && bytes >= 1024) {
        char human[32];
        kvt__format_size(bytes, human, sizeof human);
        snprintf(buf, len, "%s (%s)", value, human);
    } else {
        snprintf(buf, len, "%s", shown(value));
    }
}

static int dump_table(const kvt_config *cfg)
{
    size_t n = kvt_config_option_count();
    kvt_option_info *opts = calloc(n, sizeof *opts);
    char(*values)[VALUE_MAX + 40] = calloc(n, sizeof *values);
    if (!opts || !values) {
        free(opts);
        free(values);
        fprintf(stderr, "kvtier config: out of memory\n");
        return 2;
    }
    int w_name = 4, w_value = 5, w_def = 7, w_env = 3, w_type = 4;
    for (size_t i = 0; i < n; i++) {
        char raw[VALUE_MAX];
        kvt_status st = kvt_config_option(i, &opts[i]);
        if (!st) st = kvt_config_get(cfg, opts[i].name, raw, sizeof raw);
        if (st) {
            free(opts);
            free(values);
            return fail(st);
        }
        shown_value(&opts[i], raw, values[i], sizeof values[i]);
#define WIDEN_(w, s) if ((int)strlen(s) > (w)) (w) = (int)strlen(s)
        WIDEN_(w_name, opts[i].name);
        WIDEN_(w_value, values[i]);
        WIDEN_(w_def, shown(opts[i].default_value));
        WIDEN_(w_env, opts[i].env);
        WIDEN_(w_type, opts[i].type);
#undef WIDEN_
    }
    printf("%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", w_name, "NAME", w_value, "VALUE", w_def,
           "DEFAULT", w_env, "ENV", w_type, "TYPE", "HELP");
    for (size_t i = 0; i < n; i++)
        printf("%-*s  %-*s  %-*s  %-*s  %-*s  %s\n", w_name, opts[i].name, w_value, values[i],
               w_def, shown(opts[i].default_value), w_env, opts[i].env, w_type, opts[i].type,
               opts[i].help);
    free(opts);
    free(values);
    return 0;
}

int kvt_cmd_config(int argc, char **argv)
{
    config_args a = {0};
    int rc = parse_args(&a, argc, argv);
    if (rc) return rc == 1 ? 0 : rc;
    kvt_config *cfg = NULL;
    kvt_status st = build_config(&cfg, a.file);
    if (st) return fail(st);
    rc = a.json ? dump_json(cfg) : dump_table(cfg);
    kvt_config_destroy(cfg);
    return rc;
}
