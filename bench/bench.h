/* bench.h - `kvtier bench ...` subcommands. Each measures kvtier and the
 * machine's own limit in the same run and reports the ratio; --json prints
 * one JSON object on stdout. Return value: process exit code. */
#ifndef KVT_BENCH_BENCH_H
#define KVT_BENCH_BENCH_H

int kvt_bench_copy_main(int argc, char **argv);  /* kvtier bench copy [--json] */
/* kvtier bench copy --device cuda [--json] [--size-mb M] [--threads N] [--mode M] */
int kvt_bench_copy_cuda_main(int argc, char **argv);
int kvt_bench_index_main(int argc, char **argv); /* kvtier bench index [--json] [--blocks N] */
int kvt_bench_ssd_main(int argc, char **argv);   /* kvtier bench ssd [--json] [--dir D] [--size-mb N] */
int kvt_bench_pd_main(int argc, char **argv);    /* kvtier bench pd [--json] [--mib N] [--rounds N] */
int kvt_bench_group_main(int argc, char **argv); /* kvtier bench group [--json] */
int kvt_bench_client_main(int argc, char **argv); /* kvtier bench client [--json] [--rounds N] [--no-4k] */
/* kvtier bench engine [--json] [--rounds N] [--quick] [--pages N] [--batch N] ... */
int kvt_bench_engine_main(int argc, char **argv);
/* kvtier bench cluster [--json] [--rounds N] [--mib M] */
int kvt_bench_cluster_main(int argc, char **argv);

#endif
