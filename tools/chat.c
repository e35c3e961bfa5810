#include "chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/hash.h"

typedef struct conversation {
    uint32_t *tokens; /* system prompt, then turns */
    uint32_t len;
    uint32_t turns_done;
    uint32_t pending_user; /* tokens of the request handed out, 0 if none */
} conversation;

struct chat_workload {
    chat_params p;
    uint32_t max_tokens;
    uint32_t **system;
    conversation *convs;
    uint32_t *active;   /* indices of active conversations */
    uint32_t num_active;
    uint32_t next_conv; /* next conversation to start */
    uint64_t rng;
};

static uint32_t rand_range(chat_workload *w, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(kvt__splitmix64(&w->rng) % (hi - lo + 1));
}

static void random_tokens(chat_workload *w, uint32_t *out, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) out[i] = (uint32_t)(kvt__splitmix64(&w->rng) % 128000);
}

static bool params_ok(const chat_params *p)
{
    return p->system_prompts > 0 && p->system_tokens > 0 && p->conversations > 0 &&
           p->active > 0 && p->turns > 0 && p->user_min > 0 && p->user_min <= p->user_max &&
           p->reply_min <= p->reply_max;
}

static bool start_conversation(chat_workload *w)
{
    if (w->next_conv >= w->p.conversations) return false;
    uint32_t c = w->next_conv++;
    conversation *cv = &w->convs[c];
    cv->tokens = malloc((size_t)w->max_tokens * sizeof *cv->tokens);
    if (!cv->tokens) return false;
    uint32_t sys = c % w->p.system_prompts;
    memcpy(cv->tokens, w->system[sys], (size_t)w->p.system_tokens * sizeof(uint32_t));
    cv->len = w->p.system_tokens;
    w->active[w->num_active++] = c;
    return true;
}

chat_workload *chat_create(const chat_params *p)
{
    if (!params_ok(p)) {
        fprintf(stderr, "chat workload: every count must be positive and min <= max\n");
        return NULL;
    }
    chat_workload *w = calloc(1, sizeof *w);
    if (!w) return NULL;
    w->p = *p;
    w->rng = p->seed;
    w->max_tokens = p->system_tokens + p->turns * (p->user_max + p->reply_max);
    w->system = calloc(p->system_prompts, sizeof *w->system);
    w->convs = calloc(p->conversations, sizeof *w->convs);
    w->active = calloc(p->active, sizeof *w->active);
    if (!w->system || !w->convs || !w->active) goto fail;
    for (uint32_t s = 0; s < p->system_prompts; s++) {
        w->system[s] = malloc((size_t)p->system_tokens * sizeof(uint32_t));
        if (!w->system[s]) goto fail;
        random_tokens(w, w->system[s], p->system_tokens);
    }
    while (w->num_active < p->active && w->next_conv < p->conversations)
        if (!start_conversation(w)) goto fail;
    return w;
fail:
    chat_destroy(w);
    return NULL;
}

void chat_destroy(chat_workload *w)
{
    if (!w) return;
    if (w->system)
        for (uint32_t s = 0; s < w->p.system_prompts; s++) free(w->system[s]);
    if (w->convs)
        for (uint32_t c = 0; c < w->p.conversations; c++) free(w->convs[c].tokens);
    free(w->system);
    free(w->convs);
    free(w->active);
    free(w);
}

uint32_t chat_total_requests(const chat_workload *w) { return w->p.conversations * w->p.turns; }
uint32_t chat_max_tokens(const chat_workload *w) { return w->max_tokens; }

bool chat_next(chat_workload *w, const uint32_t **tokens, uint32_t *num_tokens, uint32_t *conv)
{
    if (w->num_active == 0) return false;
    uint32_t c = w->active[kvt__splitmix64(&w->rng) % w->num_active];
    conversation *cv = &w->convs[c];
    uint32_t user = rand_range(w, w->p.user_min, w->p.user_max);
    random_tokens(w, cv->tokens + cv->len, user);
    cv->pending_user = user;
    *tokens = cv->tokens;
    *num_tokens = cv->len + user;
    *conv = c;
    return true;
}

void chat_served(chat_workload *w, uint32_t c)
{
    conversation *cv = &w->convs[c];
    cv->len += cv->pending_user;
    cv->pending_user = 0;
    uint32_t reply = rand_range(w, w->p.reply_min, w->p.reply_max);
    random_tokens(w, cv->tokens + cv->len, reply);
    cv->len += reply;
    if (++cv->turns_done < w->p.turns) return;
    /* Finished: free its history and let a new conversation take its place. */
    free(cv->tokens);
    cv->tokens = NULL;
    for (uint32_t i = 0; i < w->num_active; i++) {
        if (w->active[i] != c) continue;
        w->active[i] = w->active[--w->num_active];
        break;
    }
    start_conversation(w);
}
