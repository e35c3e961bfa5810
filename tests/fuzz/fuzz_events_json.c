/* fuzz_events_json.c - `kvtier events`' decoder (tools/events_json.c) on
 * arbitrary bytes: a batch comes off the network from whatever answers on
 * the endpoint. Beyond "no crash, leak or UB": a refusal has a message and
 * writes nothing; an accepted batch is one line of JSON that ends in a
 * newline. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "events_json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = NULL, err[256] = "";
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return 0;
    int rc = kvt_events_batch_json(f, 7, data, size, err, sizeof err);
    fclose(f);
    if (rc == 0) {
        if (len == 0 || text[len - 1] != '\n' || memchr(text, '\n', len) != text + len - 1 ||
            strncmp(text, "{\"seq\":7,", 9) != 0)
            abort();
    } else if (len != 0 || err[0] == '\0') {
        abort();
    }
    free(text);
    return 0;
}
