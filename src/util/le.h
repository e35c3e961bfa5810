/* le.h - little-endian integers in byte buffers: every wire and disk
 * format of kvtier (group frames, connector steps, PD frames, handshakes,
 * the SSD journal) is little-endian and goes through these. Byte by byte,
 * so any alignment and any host byte order work; compilers turn them into
 * one load or store on x86 and arm64. */
#ifndef KVT_UTIL_LE_H
#define KVT_UTIL_LE_H

#include <stdint.h>

static inline void kvt__put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}
static inline void kvt__put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void kvt__put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t kvt__get16(const uint8_t *p)
{
    return (uint16_t)(p[0] | p[1] << 8);
}
static inline uint32_t kvt__get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t kvt__get64(const uint8_t *p)
{
    return (uint64_t)kvt__get32(p) | (uint64_t)kvt__get32(p + 4) << 32;
}

#endif
