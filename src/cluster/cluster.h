/* cluster.h - the cluster tier's internals for tools and tests (the
 * public calls are kvt_cluster_* in kvtier.h). */
#ifndef KVT_CLUSTER_CLUSTER_H
#define KVT_CLUSTER_CLUSTER_H

#include <stdint.h>
#include "kvtier.h"

/* The port cluster_listen was bound to (its port 0: the one chosen). */
uint16_t kvt__cluster_port(const kvt_cluster *cl);

#endif
