/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * The transport engine of the xensock BTL (Rust, mpi/src/ffi.rs), as
 * btl_xensock.c calls it. One engine per rank; single-threaded.
 */
#ifndef XENSOCK_BTL_H
#define XENSOCK_BTL_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct xsbtl_engine;

struct xsbtl_config {
    size_t max_payload;  /* largest fragment, header included */
    size_t recv_buffer;  /* receive ring per connection; 0: default */
    uint32_t linger_ms;  /* finalize waits this long for queued data */
    int check_readable;  /* nonzero: FIONREAD before each read (kernel family) */
};

struct xsbtl_callbacks {
    void *ctx;
    /* A fragment for tag arrived from the endpoint with this cookie;
     * data is valid during the call only. */
    void (*deliver)(void *ctx, void *endpoint, uint8_t tag, const uint8_t *data, size_t len);
    /* A send queued in place (xsbtl_send returned 0) completed (ok = 1)
     * or was dropped because its endpoint failed (ok = 0). */
    void (*completed)(void *ctx, void *send, int ok);
    /* The endpoint's peer is lost or broke the protocol. */
    void (*failed)(void *ctx, void *endpoint, const char *why);
    /* A line for the verbose output. */
    void (*note)(void *ctx, const char *what);
    /* A rank with no endpoint connected (Open MPI adds peers on other
     * nodes at first send): add it with xsbtl_add and return 1, or 0. */
    int (*unknown_rank)(void *ctx, uint64_t name);
};

struct xsbtl_engine *xsbtl_open(uint64_t name, const struct xsbtl_config *cfg,
                                const struct xsbtl_callbacks *cb, char *err, size_t errlen);
size_t xsbtl_card(const struct xsbtl_engine *e, uint8_t *buf, size_t len);
void xsbtl_describe(const struct xsbtl_engine *e, char *buf, size_t len);
int xsbtl_add(const struct xsbtl_engine *e, uint64_t name, const uint8_t *card, size_t len,
              void *cookie, uint32_t *id, char *why, size_t whylen);
void xsbtl_remove(const struct xsbtl_engine *e, uint32_t id);
int xsbtl_send(const struct xsbtl_engine *e, uint32_t id, uint8_t tag, const struct iovec *iov,
               int iovcnt, void *cookie, char *why, size_t whylen);
int xsbtl_progress(const struct xsbtl_engine *e);
void xsbtl_close(struct xsbtl_engine *e);

#endif
