/* cmd_trace.c - `kvtier trace synth --out FILE [--requests N] [--seed S]
 * [--prompts P] [--conversations C]`: a Mooncake-format request trace
 * (JSONL: timestamp in ms, input_length, output_length, hash_ids of
 * 512-token blocks) shaped like multi-turn chat, so a user without a trace
 * of their own can run `kvtier replay` and `kvtier plan` (README).
 *
 * The shape: P shared system prompts (2..8 blocks each); C conversations
 * live at once, each on one prompt, growing by 1..4 blocks a turn for
 * 3..10 turns, then replaced by a new one; requests go to a random live
 * conversation, 20..400 ms apart. Block ids are handed out once, so a
 * hash id always follows the same parent (as the reader requires), and
 * the same seed gives the same file, byte for byte. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli_util.h"
#include "cmds.h"
#include "util/hash.h"

#define SYNTH_BLOCK_TOKENS 512u
#define SYNTH_MAX_PROMPT 8u
#define SYNTH_MAX_BLOCKS 256u /* a conversation's own blocks, at most */

typedef struct synth_conv {
    uint32_t prompt, turns_left, n;
    uint64_t blocks[SYNTH_MAX_BLOCKS];
} synth_conv;

typedef struct synth {
    uint64_t rng, next_id, ms;
    uint32_t nprompts, nconvs;
    uint32_t prompt_len[64];
    uint64_t prompt[64][SYNTH_MAX_PROMPT];
    synth_conv *convs;
} synth;

static uint32_t below(synth *s, uint32_t n) { return (uint32_t)(kvt__splitmix64(&s->rng) % n); }

static void conv_start(synth *s, synth_conv *c)
{
    c->prompt = below(s, s->nprompts);
    c->turns_left = 3 + below(s, 8);
    c->n = 0;
}

/* One request of conversation c as a JSON line on f. */
static void emit(synth *s, synth_conv *c, FILE *f)
{
    if (!c->turns_left || c->n + 4 > SYNTH_MAX_BLOCKS) conv_start(s, c);
    for (uint32_t k = 1 + below(s, 4); k > 0; k--) c->blocks[c->n++] = s->next_id++;
    c->turns_left--;
    uint32_t plen = s->prompt_len[c->prompt], nb = plen + c->n;
    uint32_t input = nb * SYNTH_BLOCK_TOKENS - below(s, SYNTH_BLOCK_TOKENS);
    fprintf(f, "{\"timestamp\": %llu, \"input_length\": %u, \"output_length\": %u, \"hash_ids\": [",
            (unsigned long long)s->ms, input, 16 + below(s, 497));
    for (uint32_t i = 0; i < nb; i++)
        fprintf(f, "%s%llu", i ? ", " : "",
                (unsigned long long)(i < plen ? s->prompt[c->prompt][i] : c->blocks[i - plen]));
    fprintf(f, "]}\n");
    s->ms += 20 + below(s, 381);
}

static int usage(FILE *f, int rc)
{
    fprintf(f, "usage: kvtier trace synth --out FILE [--requests N] [--seed S] [--prompts P]\n"
               "                          [--conversations C]\n"
               "  a Mooncake-format trace (JSONL, 512-token blocks) shaped like multi-turn chat,\n"
               "  for kvtier replay and kvtier plan; the same seed gives the same file\n"
               "  --requests N       requests (1..1000000, default 2000)\n"
               "  --seed S           default 1\n"
               "  --prompts P        shared system prompts (1..64, default 8)\n"
               "  --conversations C  conversations live at once (1..4096, default 64)\n");
    return rc;
}

static int synth_main(int argc, char **argv)
{
    const char *out = NULL;
    uint64_t requests = 2000, seed = 1, prompts = 8, convs = 64;
    static const char *const takes_value[] = {"--out", "--requests", "--seed", "--prompts",
                                              "--conversations", NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) return usage(stdout, 0);
        if (!cli_arg_in(a, takes_value)) return cli_bad_arg("trace synth", a, false);
        if (!v) return cli_bad_arg("trace synth", a, true);
        i++;
        if (!strcmp(a, "--out")) out = v;
        else if (!strcmp(a, "--requests") && demo_parse_u64(v, &requests) && requests >= 1 &&
                 requests <= 1000000) {}
        else if (!strcmp(a, "--seed") && demo_parse_u64(v, &seed)) {}
        else if (!strcmp(a, "--prompts") && demo_parse_u64(v, &prompts) && prompts >= 1 &&
                 prompts <= 64) {}
        else if (!strcmp(a, "--conversations") && demo_parse_u64(v, &convs) && convs >= 1 &&
                 convs <= 4096) {}
        else return cli_bad_value("trace synth", a, v);
    }
    if (!out) return usage(stderr, 2);
    synth s = {.rng = seed, .nprompts = (uint32_t)prompts, .nconvs = (uint32_t)convs};
    for (uint32_t p = 0; p < s.nprompts; p++) {
        s.prompt_len[p] = 2 + below(&s, SYNTH_MAX_PROMPT - 1);
        for (uint32_t k = 0; k < s.prompt_len[p]; k++) s.prompt[p][k] = s.next_id++;
    }
    s.convs = calloc(s.nconvs, sizeof *s.convs);
    FILE *f = s.convs ? fopen(out, "w") : NULL;
    if (!f) {
        fprintf(stderr, "kvtier trace synth: cannot write %s: %s\n", out,
                s.convs ? strerror(errno) : "out of memory");
        free(s.convs);
        return 1;
    }
    for (uint32_t c = 0; c < s.nconvs; c++) conv_start(&s, &s.convs[c]);
    for (uint64_t r = 0; r < requests; r++) emit(&s, &s.convs[below(&s, s.nconvs)], f);
    int bad = ferror(f);
    if (fclose(f) != 0) bad = 1;
    free(s.convs);
    if (bad) {
        fprintf(stderr, "kvtier trace synth: writing %s failed\n", out);
        return 1;
    }
    printf("kvtier trace synth: %llu requests (seed %llu, %u prompts, %u conversations) in %s\n",
           (unsigned long long)requests, (unsigned long long)seed, s.nprompts, s.nconvs, out);
    return 0;
}

int kvt_cmd_trace(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "synth")) return synth_main(argc - 1, argv + 1);
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")))
        return usage(stdout, 0);
    if (argc >= 2) return cli_bad_arg("trace", argv[1], false);
    fprintf(stderr, "kvtier trace: which one? (synth)\n");
    return usage(stderr, 2);
}
