/* bench_util.c - min/median/max and host facts for the benches (bench_util.h). */
#include "bench_util.h"

#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "cli_util.h"

stat3 stat3_of(const double *v, uint32_t n)
{
    stat3 s = {-1, -1, -1};
    double *c = n ? malloc(n * sizeof *c) : NULL;
    uint32_t k = 0;
    for (uint32_t i = 0; c && i < n; i++)
        if (v[i] >= 0) c[k++] = v[i];
    if (k) {
        s.min = s.max = c[0];
        for (uint32_t i = 1; i < k; i++) {
            if (c[i] < s.min) s.min = c[i];
            if (c[i] > s.max) s.max = c[i];
        }
        s.med = median_of_values(c, k);
    }
    free(c);
    return s;
}

void stat3_json(const char *key, stat3 s, bool comma)
{
    printf("\"%s\": {\"min\": %.6g, \"median\": %.6g, \"max\": %.6g}%s", key, s.min, s.med, s.max,
           comma ? ", " : "");
}

typedef struct host_facts {
    long cpus, page_size;
    char model[96], flags[128], thp[32], shmem_thp[32], kernel[96];
    unsigned long long hugepages, mem_total;
    double load1;
} host_facts;

/* The bracketed mode of a THP setting ("enabled", "shmem_enabled"). */
static void thp_mode(const char *which, char *out, size_t n)
{
    char path[96], line[128];
    snprintf(path, sizeof path, "/sys/kernel/mm/transparent_hugepage/%s", which);
    snprintf(out, n, "unknown");
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (fgets(line, sizeof line, f)) {
        char *a = strchr(line, '['), *z = a ? strchr(a, ']') : NULL;
        if (a && z) snprintf(out, n, "%.*s", (int)(z - a - 1), a + 1);
    }
    fclose(f);
}

/* The features kvtier's paths use, among the CPU's flags: streaming copies
 * (sse4_2, avx2, avx512f), XXH3 (avx2), libsodium and hashes (aes,
 * pclmulqdq, sha_ni). */
static void cpu_facts(host_facts *h)
{
    static const char *const want[] = {"sse4_2", "avx2", "avx512f", "aes", "pclmulqdq",
                                       "sha_ni", "vaes", "vpclmulqdq"};
    char line[8192];
    FILE *f = fopen("/proc/cpuinfo", "r");
    snprintf(h->model, sizeof h->model, "unknown");
    while (f && fgets(line, sizeof line, f)) {
        char *colon = strchr(line, ':');
        if (!colon) continue;
        if (!strncmp(line, "model name", 10)) {
            snprintf(h->model, sizeof h->model, "%s", colon + 2);
            h->model[strcspn(h->model, "\n\"\\")] = 0;
        } else if (!strncmp(line, "flags", 5)) {
            size_t used = 0;
            for (size_t i = 0; i < sizeof want / sizeof *want; i++) {
                char pat[32];
                snprintf(pat, sizeof pat, " %s", want[i]);
                char *p = strstr(colon, pat);
                if (!p || (p[strlen(pat)] != ' ' && p[strlen(pat)] != '\n')) continue;
                int n = snprintf(h->flags + used, sizeof h->flags - used, "%s%s", used ? " " : "",
                                 want[i]);
                if (n > 0 && (size_t)n < sizeof h->flags - used) used += (size_t)n;
            }
            break; /* the first CPU's flags: the others match */
        }
    }
    if (f) fclose(f);
}

static unsigned long long meminfo(const char *key)
{
    char line[256];
    unsigned long long v = 0;
    size_t kn = strlen(key);
    FILE *f = fopen("/proc/meminfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, kn) && line[kn] == ':') {
            v = strtoull(line + kn + 1, NULL, 10);
            break;
        }
    if (f) fclose(f);
    return v;
}

static void host_get(host_facts *h)
{
    memset(h, 0, sizeof *h);
    h->cpus = sysconf(_SC_NPROCESSORS_ONLN);
    h->page_size = sysconf(_SC_PAGESIZE);
    cpu_facts(h);
    thp_mode("enabled", h->thp, sizeof h->thp);
    thp_mode("shmem_enabled", h->shmem_thp, sizeof h->shmem_thp);
    h->hugepages = meminfo("HugePages_Total");
    h->mem_total = meminfo("MemTotal") * 1024;
    struct utsname u;
    snprintf(h->kernel, sizeof h->kernel, "%s", uname(&u) == 0 ? u.release : "unknown");
    double l[1] = {-1};
    if (getloadavg(l, 1) == 1) h->load1 = l[0];
}

void bench_host_json(bool comma)
{
    host_facts h;
    host_get(&h);
    printf("\"host\": {\"cpus\": %ld, \"cpu_model\": \"%s\", \"cpu_flags\": \"%s\", \"page_size\": "
           "%ld, \"thp\": \"%s\", \"shmem_thp\": \"%s\", \"hugepages_total\": %llu, "
           "\"mem_total_bytes\": %llu, \"kernel\": \"%s\", \"loadavg_1m\": %.2f}%s",
           h.cpus, h.model, h.flags, h.page_size, h.thp, h.shmem_thp, h.hugepages, h.mem_total,
           h.kernel, h.load1, comma ? ", " : "");
}

void bench_host_text(FILE *f)
{
    host_facts h;
    host_get(&h);
    fprintf(f, "host: %ld CPUs (%s; %s), %ld B pages, THP %s (shmem %s), %llu huge pages, "
            "%.1f GiB, kernel %s, load %.2f\n", h.cpus, h.model, h.flags[0] ? h.flags : "-",
            h.page_size, h.thp, h.shmem_thp, h.hugepages, h.mem_total / 1073741824.0, h.kernel,
            h.load1);
}
