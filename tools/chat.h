/* chat.h - a multi-turn chat workload: shared system prompts and
 * conversations that grow turn by turn, a few active at a time. Each request
 * is system prompt + history + a new user message; after it is served the
 * assistant's reply joins the history. Deterministic from a seed. */
#ifndef KVT_TOOLS_CHAT_H
#define KVT_TOOLS_CHAT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct chat_params {
    uint32_t system_prompts; /* distinct system prompts shared by conversations */
    uint32_t system_tokens;  /* tokens per system prompt */
    uint32_t conversations;  /* total conversations */
    uint32_t active;         /* conversations interleaved at any time */
    uint32_t turns;          /* requests per conversation */
    uint32_t user_min, user_max;   /* user message tokens */
    uint32_t reply_min, reply_max; /* assistant reply tokens */
    uint64_t seed;
} chat_params;

typedef struct chat_workload chat_workload;

/* NULL on bad parameters or out of memory (message on stderr). */
chat_workload *chat_create(const chat_params *p);
void chat_destroy(chat_workload *w);
uint32_t chat_total_requests(const chat_workload *w);
/* The longest request any conversation can reach, in tokens. */
uint32_t chat_max_tokens(const chat_workload *w);
/* The next request: *tokens stays valid until chat_served is called for it.
 * Returns false when every conversation has finished. conv identifies the
 * conversation for chat_served. */
bool chat_next(chat_workload *w, const uint32_t **tokens, uint32_t *num_tokens, uint32_t *conv);
/* Appends the reply to conversation conv (after its request was served). */
void chat_served(chat_workload *w, uint32_t conv);

#endif
