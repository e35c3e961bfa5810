#include <stdio.h>
#include <stdlib.h>

#include <cjson/cJSON.h>

#include "demo_util.h"
#include "util/parse.h"

void demo_report_text(const demo_report *r)
{
    char cap[32], blk[32], st[32], ld[32], ver[32];
    kvt__format_size(r->cpu_capacity, cap, sizeof cap);
    kvt__format_size(r->block_bytes, blk, sizeof blk);
    kvt__format_size(r->stored_bytes, st, sizeof st);
    kvt__format_size(r->loaded_bytes, ld, sizeof ld);
    kvt__format_size(r->verified_bytes, ver, sizeof ver);
    printf("kvtier demo: %u requests served in %.1f s\n", r->requests, r->elapsed_s);
    printf("  CPU tier          %s (%llu blocks of %s)\n", cap, (unsigned long long)r->cpu_blocks, blk);
    printf("  prefix hit rate   %.1f%% of tokens (%llu of %llu)\n", 100.0 * r->hit_rate,
           (unsigned long long)r->hit_tokens, (unsigned long long)r->lookup_tokens);
    if (r->ssd_dir) {
        char sc[32];
        kvt__format_size(r->ssd_capacity, sc, sizeof sc);
        printf("  SSD tier          %s in %s\n", sc, r->ssd_dir);
        printf("  hits per tier     CPU %llu tokens, SSD %llu tokens\n",
               (unsigned long long)(r->hit_tokens - r->ssd_hit_tokens),
               (unsigned long long)r->ssd_hit_tokens);
        printf("  SSD traffic       %llu blocks written, %llu recovered at start, "
               "%llu CPU copies dropped, %llu corrupt\n",
               (unsigned long long)r->ssd_written_blocks, (unsigned long long)r->recovered_blocks,
               (unsigned long long)r->cpu_dropped_blocks, (unsigned long long)r->corrupt_blocks);
    }
    printf("  stored            %s\n", st);
    printf("  loaded            %s at %.2f GB/s\n", ld, r->load_gbps);
    printf("  evicted           %llu blocks\n", (unsigned long long)r->evicted_blocks);
    printf("  lookup latency    p50 %.1f us, p99 %.1f us\n", r->lookup_p50_us, r->lookup_p99_us);
    printf("  load latency      p50 %.2f ms, p99 %.2f ms\n", r->load_p50_ms, r->load_p99_ms);
    printf("  verification      %s checked, %llu mismatching bytes, %u failed tasks: %s\n", ver,
           (unsigned long long)r->mismatches, r->failures,
           r->mismatches || r->failures ? "FAILED" : "OK");
}

void demo_report_json(const demo_report *r)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "requests", r->requests);
    cJSON_AddNumberToObject(o, "hit_rate", r->hit_rate);
    cJSON_AddNumberToObject(o, "hit_tokens", (double)r->hit_tokens);
    cJSON_AddNumberToObject(o, "lookup_tokens", (double)r->lookup_tokens);
    cJSON_AddNumberToObject(o, "stored_bytes", (double)r->stored_bytes);
    cJSON_AddNumberToObject(o, "loaded_bytes", (double)r->loaded_bytes);
    cJSON_AddNumberToObject(o, "load_gbps", r->load_gbps);
    cJSON_AddNumberToObject(o, "lookup_p50_us", r->lookup_p50_us);
    cJSON_AddNumberToObject(o, "lookup_p99_us", r->lookup_p99_us);
    cJSON_AddNumberToObject(o, "load_p50_ms", r->load_p50_ms);
    cJSON_AddNumberToObject(o, "load_p99_ms", r->load_p99_ms);
    cJSON_AddNumberToObject(o, "evicted_blocks", (double)r->evicted_blocks);
    cJSON_AddNumberToObject(o, "verified_bytes", (double)r->verified_bytes);
    cJSON_AddNumberToObject(o, "mismatches", (double)r->mismatches);
    cJSON_AddNumberToObject(o, "failed_tasks", r->failures);
    cJSON_AddNumberToObject(o, "elapsed_s", r->elapsed_s);
    cJSON_AddNumberToObject(o, "cpu_capacity", (double)r->cpu_capacity);
    cJSON_AddNumberToObject(o, "block_bytes", (double)r->block_bytes);
    cJSON_AddNumberToObject(o, "cpu_hit_tokens", (double)(r->hit_tokens - r->ssd_hit_tokens));
    cJSON_AddNumberToObject(o, "ssd_hit_tokens", (double)r->ssd_hit_tokens);
    cJSON_AddNumberToObject(o, "ssd_capacity", (double)r->ssd_capacity);
    cJSON_AddNumberToObject(o, "ssd_written_blocks", (double)r->ssd_written_blocks);
    cJSON_AddNumberToObject(o, "recovered_blocks", (double)r->recovered_blocks);
    cJSON_AddNumberToObject(o, "corrupt_blocks", (double)r->corrupt_blocks);
    cJSON_AddNumberToObject(o, "cpu_dropped_blocks", (double)r->cpu_dropped_blocks);
    char *s = cJSON_Print(o);
    if (s) puts(s);
    free(s);
    cJSON_Delete(o);
}
