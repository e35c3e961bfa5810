/* bootstrap.h - the client side of the PD bootstrap service (the directory
 * of prefill ranks, bootstrap.c), for the sender (register, renew,
 * unregister) and the receiver (lookup). Internal.
 *
 * Registrations are leases. The OK answer to REG_PREFILL carries the lease
 * length in ms in the header's a0 (0 from a service that predates leases:
 * the entry never expires). The service drops an entry lease_ms after its
 * last REG_PREFILL; renewing is sending the same REG_PREFILL again (the
 * entry of the same tp_rank/dcp_rank replaces itself). A prefill rank
 * renews every lease_ms / 3, so two renewals in a row may fail before its
 * entry lapses. UNREG_PREFILL (same body) removes the entry of the same
 * tp_rank/dcp_rank only when its data address matches too; its OK carries
 * in a0 the number of entries removed (0 or 1). */
#ifndef KVT_PD_BOOTSTRAP_H
#define KVT_PD_BOOTSTRAP_H

#include <stdint.h>
#include "net/stream.h"
#include "pd/desc.h"
#include "pd/wire.h"

/* body: desc, u16 port, host[64] (as REG_PREFILL); OK a0 = entries removed.
 * Until wire.h's enum pd_frame_type has it; delete this block then (it is
 * harmless meanwhile: wire.h is included above, so the macro only follows
 * the enumerator). */

/* A registration's token: random, made by the service for each new entry
 * and given to its registrant in the OK of REG_PREFILL (its body). The
 * registrant presents it (after the data address) in every REG_PREFILL
 * and UNREG_PREFILL: only a holder may unregister the entry, and, on a
 * service without a secret, renew it with another descriptor (a renewal
 * that changes nothing is taken from anyone, and its OK carries zeros).
 * So another process on the prefill host cannot remove a live entry and
 * put its own address in (its decode ranks would take that peer's bytes
 * for KV). */
#define PD_BS_TOKEN_LEN 16

/* Lease of a registration: 4 x the service's peer_timeout_ms, at least
 * 1 s (12 s with the defaults). */
#define PD_BS_LEASE_FACTOR 4
#define PD_BS_LEASE_MIN_MS 1000u
/* The bound on a connection's authentication + request (the service's
 * min(peer_timeout_ms, PD_BS_GREETING_MAX_MS)). */
#define PD_BS_GREETING_MAX_MS 2000u

/* Registers (or renews) prefill rank desc, whose data listener is
 * data_host:data_port, with the service at bs_host (NULL: 127.0.0.1) :
 * bs_port, by deadline_ns. token: the entry's token this rank holds
 * (zeros: none yet), replaced by what the OK gives. *lease_ms_out (may be NULL) gets the lease
 * length (0: the entry never expires). KVT_EBUSY: live registrations of
 * another TP/DCP configuration (the message names both and when the first
 * of those leases expires); KVT_EFULL: tp_size x dcp_size exceeds the
 * service's table; else the service's or the connection's status. */
/* A RETRY (KVT_EAGAIN from the call, the failure kept as the message) to
 * a request other than a lookup: the peer breaks the protocol. KVT_EPROTO
 * naming what was asked and peer ("the bootstrap service at h:p", "the
 * prefill rank"). */
kvt_status pd_retry_refused(const char *what, const char *peer);
kvt_status pd_bootstrap_register(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                                 const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                                 const char *data_host, uint16_t data_port, uint64_t deadline_ns,
                                 uint8_t token[PD_BS_TOKEN_LEN], uint32_t *lease_ms_out);
/* Removes that registration (only where tp_rank, dcp_rank and address all
 * match and token is the entry's; token NULL: zeros, which never is). Best effort, meant for destroy: pass a short deadline (e.g.
 * kvt__deadline_ns(500)). *removed_out (may be NULL): entries removed. */
kvt_status pd_bootstrap_unregister(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                                   const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                                   const char *data_host, uint16_t data_port, uint64_t deadline_ns,
                                   const uint8_t token[PD_BS_TOKEN_LEN], uint32_t *removed_out);
/* One lookup by decode rank desc: on KVT_OK *topo (malloc'd, the caller
 * frees) gets the TOPO body; KVT_EAGAIN with the service's RETRY text
 * ("2 of 4 prefill ranks registered; missing tp2/4 dcp0/1, ...") when not
 * every prefill rank holds a live lease; a refusal's status otherwise. */
kvt_status pd_bootstrap_lookup(const kvt_pd_net_params *net, const kvt_stream_auth *auth,
                               const char *bs_host, uint16_t bs_port, const pd_desc *desc,
                               uint64_t deadline_ns, uint8_t **topo, uint32_t *topo_len);

#endif
