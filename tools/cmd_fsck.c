/* cmd_fsck.c - `kvtier fsck DIR[,DIR2...] [--repair] [--json]`: checks an
 * SSD cache directory set (metadata, journal, every block's checksum)
 * without changing it; --repair rewrites the journal keeping the good
 * records, refused while a store holds the directories. Exit 0 when clean
 * (or repaired), 1 when damage remains or the check failed, 2 on usage. */
#include <stdio.h>
#include <string.h>
#include "cli_util.h"
#include "cmds.h"
#include "store/ssd.h"

static void json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c < 0x20) printf("\\u%04x", c);
        else putchar(c);
    }
    putchar('"');
}

static void print_report(const char *dirs, const kvt_ssd_fsck_report *r, bool ok, bool json)
{
    if (json) {
        printf("{\"dirs\": ");
        json_string(dirs);
        printf(", \"describe\": ");
        json_string(r->describe);
        printf(", \"digest\": \"0x%016llx\", \"block_bytes\": %llu, \"slots\": %u, \"blocks\": %u, "
               "\"bad_blocks\": %u, \"missing_blocks\": %u, \"orphan_blocks\": %u, "
               "\"records\": %u, \"bad_records\": %u, \"skipped_records\": %u, "
               "\"journal_truncated\": %s, "
               "\"data_truncated\": %s, \"repaired\": %s, \"ok\": %s}\n",
               (unsigned long long)r->digest, (unsigned long long)r->block_bytes, r->slots_total,
               r->blocks, r->bad_blocks, r->missing_blocks, r->orphan_blocks, r->records,
               r->bad_records, r->skipped_records, r->journal_truncated ? "true" : "false",
               r->data_truncated ? "true" : "false", r->repaired ? "true" : "false",
               ok ? "true" : "false");
        return;
    }
    printf("%s\n  geometry:  \"%s\" (digest 0x%016llx, %llu-byte blocks)\n"
           "  blocks:    %u in %u slots, %u bad",
           dirs, r->describe, (unsigned long long)r->digest, (unsigned long long)r->block_bytes,
           r->blocks, r->slots_total, r->bad_blocks);
    if (r->missing_blocks || r->data_truncated)
        printf(", %u missing (the data file is truncated: %llu of %llu bytes)", r->missing_blocks,
               (unsigned long long)r->data_bytes, (unsigned long long)r->data_bytes_needed);
    printf("\n  journal:   %u records, %u bad records%s\n", r->records, r->bad_records,
           r->journal_truncated ? ", torn tail" : "");
    if (r->skipped_records)
        printf("  lost:      %u damaged record%s skipped, the records after %s kept; at most "
               "%u block%s lost with %s\n", r->skipped_records, r->skipped_records == 1 ? "" : "s",
               r->skipped_records == 1 ? "it" : "them", r->skipped_records,
               r->skipped_records == 1 ? "" : "s", r->skipped_records == 1 ? "it" : "them");
    uint32_t lost = r->bad_blocks + r->missing_blocks;
    if (lost)
        printf("  lost:      %u block%s (%u bad, %u missing)\n", lost, lost == 1 ? "" : "s",
               r->bad_blocks, r->missing_blocks);
    if (r->orphan_blocks)
        printf("  orphans:   %u good block%s cut off from %s prefix (a block before %s is lost "
               "or was never written); the next start frees %s\n", r->orphan_blocks,
               r->orphan_blocks == 1 ? "" : "s", r->orphan_blocks == 1 ? "its" : "their",
               r->orphan_blocks == 1 ? "it" : "them", r->orphan_blocks == 1 ? "it" : "them");
    printf("  %s\n", r->repaired ? "repaired: the journal now holds only the good blocks"
                    : ok ? "ok" : "damaged: run with --repair to drop what is bad");
}

int kvt_cmd_fsck(int argc, char **argv)
{
    const char *dirs = NULL;
    bool repair = false, json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--repair") == 0) repair = true;
        else if (strcmp(argv[i], "--json") == 0) json = true;
        else if (argv[i][0] != '-' && !dirs) dirs = argv[i];
        else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            printf("usage: kvtier fsck DIR[,DIR2...] [--repair] [--json]\n");
            return 0;
        } else {
            return cli_bad_arg("fsck", argv[i], false);
        }
    }
    if (!dirs) {
        fprintf(stderr, "kvtier fsck: which directory? usage: kvtier fsck DIR[,DIR2...] [--repair] [--json]\n");
        return 2;
    }
    kvt_ssd_fsck_report r;
    kvt_status st = kvt__ssd_fsck(dirs, repair, &r);
    if (st != KVT_OK) {
        fprintf(stderr, "kvtier fsck: %s: %s\n", kvt_strerror(st), kvt_last_error());
        return 1;
    }
    bool ok = r.repaired || (r.bad_blocks == 0 && r.missing_blocks == 0 && !r.journal_truncated &&
                             r.bad_records == 0);
    print_report(dirs, &r, ok, json);
    return ok ? 0 : 1;
}
