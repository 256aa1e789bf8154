/* SPDX-License-Identifier: MIT OR Apache-2.0 */
/*
 * Open MPI's xensock BTL: the component and module tables, descriptors
 * and the modex, which Open MPI's macros and object system make C. Bytes
 * move in the Rust engine (xensock_btl.h); this file translates.
 *
 * Send path: prepare_src packs non-contiguous data into a fragment or
 * points at the user's contiguous buffer; send hands the segments to the
 * engine, which writes what the connection takes and keeps the rest by
 * reference until it leaves (the descriptor completes then). sendi writes
 * header and contiguous data directly and copies what cannot leave at
 * once; non-contiguous data goes through a fragment as send's does.
 *
 * Threads: the engine takes one reentrant lock per call, so the module
 * works under MPI_THREAD_MULTIPLE; progress from a second thread while
 * one is inside returns at once.
 *
 * Receive path: the engine reads whole frames into its buffer and calls
 * deliver, which runs the active-message callback of the frame's tag on
 * a descriptor that points into that buffer.
 */

#include "opal_config.h"

#include <string.h>

#include "opal/class/opal_bitmap.h"
#include "opal/class/opal_free_list.h"
#include "opal/class/opal_hash_table.h"
#include "opal/datatype/opal_convertor.h"
#include "opal/mca/btl/base/base.h"
#include "opal/mca/btl/base/btl_base_error.h"
#include "opal/mca/btl/btl.h"
#include "opal/mca/pmix/pmix.h"
#include "opal/util/output.h"
#include "opal/util/proc.h"

#include "xensock_btl.h"

struct mca_btl_base_endpoint_t {
    opal_proc_t *proc;
    uint32_t id;
};

typedef struct {
    mca_btl_base_module_t super;
    struct xsbtl_engine *engine;
    mca_btl_base_module_error_cb_fn_t error_cb;
} mca_btl_xensock_module_t;

typedef struct {
    mca_btl_base_descriptor_t base;
    mca_btl_base_segment_t segments[2];
    struct mca_btl_base_endpoint_t *endpoint;
    opal_free_list_t *list;
    unsigned char *data;
} xensock_frag_t;

static OBJ_CLASS_INSTANCE(xensock_frag_t, mca_btl_base_descriptor_t, NULL, NULL);

static int xensock_register(void);
static int xensock_open(void);
static int xensock_close(void);
static mca_btl_base_module_t **xensock_init(int *num_btls, bool progress_threads, bool mpi_threads);
static int xensock_progress(void);

mca_btl_base_component_3_0_0_t mca_btl_xensock_component = {
    .btl_version = {
        MCA_BTL_DEFAULT_VERSION("xensock"),
        .mca_open_component = xensock_open,
        .mca_close_component = xensock_close,
        .mca_register_component_params = xensock_register,
    },
    .btl_data = {
        .param_field = MCA_BASE_METADATA_PARAM_CHECKPOINT,
    },
    .btl_init = xensock_init,
    .btl_progress = xensock_progress,
};

static mca_btl_xensock_module_t xensock_module;
static opal_free_list_t eager_frags, max_frags;
/* endpoints by process name: add_procs runs again for a peer the BTL
 * added itself when it connected first (on_unknown_rank) */
static opal_hash_table_t endpoints;
static unsigned int recv_buffer_kib = 0;
static unsigned int linger_ms = 5000;
static int free_list_max = 1024;
static bool check_readable = false;

#define VERBOSE(level, ...) \
    opal_output_verbose(level, opal_btl_base_framework.framework_output, "btl:xensock: " __VA_ARGS__)

static uint64_t name_of(const opal_proc_t *proc)
{
    uint64_t name;
    _Static_assert(sizeof(proc->proc_name) == sizeof(name), "process names are 64 bits");
    memcpy(&name, &proc->proc_name, sizeof(name));
    return name;
}

/* ---- the engine's callbacks ---- */

static void on_deliver(void *ctx, void *endpoint, uint8_t tag, const uint8_t *data, size_t len)
{
    mca_btl_active_message_callback_t *reg = mca_btl_base_active_message_trigger + tag;
    mca_btl_base_segment_t segment = {.seg_addr.pval = (void *) data, .seg_len = len};
    mca_btl_base_descriptor_t des = {.des_segments = &segment, .des_segment_count = 1};
    (void) ctx;
    (void) endpoint;
    if (NULL == reg->cbfunc) {
        VERBOSE(1, "a fragment for tag %u, which nobody registered; dropped", tag);
        return;
    }
    reg->cbfunc(&xensock_module.super, tag, &des, reg->cbdata);
}

static int xensock_free(mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des);

static void on_completed(void *ctx, void *send, int ok)
{
    xensock_frag_t *frag = (xensock_frag_t *) send;
    int owned = frag->base.des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP;
    (void) ctx;
    if (NULL != frag->base.des_cbfunc) {
        frag->base.des_cbfunc(&xensock_module.super, frag->endpoint, &frag->base,
                              ok ? OPAL_SUCCESS : OPAL_ERR_UNREACH);
    }
    if (owned) {
        xensock_free(&xensock_module.super, &frag->base);
    }
}

static void on_failed(void *ctx, void *endpoint, const char *why)
{
    struct mca_btl_base_endpoint_t *ep = endpoint;
    char info[512];
    (void) ctx;
    snprintf(info, sizeof(info), "xensock: rank %s: %s", OPAL_NAME_PRINT(ep->proc->proc_name), why);
    opal_output(0, "btl:xensock: %s", info);
    if (NULL != xensock_module.error_cb) {
        xensock_module.error_cb(&xensock_module.super, MCA_BTL_ERROR_FLAGS_FATAL, ep->proc, info);
    }
}

static void on_note(void *ctx, const char *what)
{
    (void) ctx;
    VERBOSE(5, "%s", what);
}

static int xensock_add_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                             struct mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable);

/* Open MPI adds peers on other nodes when it first sends to them, so a
 * rank that only receives has not added the sender yet: add it now, as
 * btl/tcp does for a connection from an unknown process. */
static int on_unknown_rank(void *ctx, uint64_t name)
{
    opal_process_name_t pname;
    opal_proc_t *proc;
    struct mca_btl_base_endpoint_t *ep = NULL;
    (void) ctx;
    memcpy(&pname, &name, sizeof(pname));
    proc = opal_proc_for_name(pname);
    if (NULL == proc) {
        VERBOSE(5, "a connection from %s, which Open MPI does not know", OPAL_NAME_PRINT(pname));
        return 0;
    }
    (void) xensock_add_procs(&xensock_module.super, 1, &proc, &ep, NULL);
    return NULL != ep;
}

/* ---- module ---- */

static int xensock_add_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                             struct mca_btl_base_endpoint_t **peers, opal_bitmap_t *reachable)
{
    opal_proc_t *me = opal_proc_local_get();
    for (size_t i = 0; i < nprocs; i++) {
        uint8_t *card = NULL;
        size_t size = 0;
        char why[256] = "";
        int rc;
        struct mca_btl_base_endpoint_t *ep;

        if (procs[i] == me || NULL != peers[i]) {
            continue;
        }
        if (OPAL_SUCCESS == opal_hash_table_get_value_uint64(&endpoints, name_of(procs[i]),
                                                             (void **) &ep)) {
            /* added before, when it connected first */
            peers[i] = ep;
            if (NULL != reachable) {
                opal_bitmap_set_bit(reachable, (int) i);
            }
            continue;
        }
        OPAL_MODEX_RECV(rc, &mca_btl_xensock_component.btl_version, &procs[i]->proc_name,
                        (uint8_t **) &card, &size);
        if (OPAL_SUCCESS != rc) {
            VERBOSE(10, "rank %s published no card", OPAL_NAME_PRINT(procs[i]->proc_name));
            continue;
        }
        ep = calloc(1, sizeof(*ep));
        if (NULL == ep) {
            free(card);
            return OPAL_ERR_OUT_OF_RESOURCE;
        }
        ep->proc = procs[i];
        if (!xsbtl_add(xensock_module.engine, name_of(procs[i]), card, size, ep, &ep->id, why,
                       sizeof(why))) {
            VERBOSE(10, "rank %s not over xensock: %s", OPAL_NAME_PRINT(procs[i]->proc_name), why);
            free(ep);
            free(card);
            continue;
        }
        free(card);
        VERBOSE(10, "rank %s reachable over xensock", OPAL_NAME_PRINT(procs[i]->proc_name));
        (void) opal_hash_table_set_value_uint64(&endpoints, name_of(procs[i]), ep);
        peers[i] = ep;
        if (NULL != reachable) {
            opal_bitmap_set_bit(reachable, (int) i);
        }
    }
    return OPAL_SUCCESS;
}

static int xensock_del_procs(mca_btl_base_module_t *btl, size_t nprocs, opal_proc_t **procs,
                             struct mca_btl_base_endpoint_t **peers)
{
    (void) btl;
    (void) procs;
    for (size_t i = 0; i < nprocs; i++) {
        if (NULL != peers[i]) {
            (void) opal_hash_table_remove_value_uint64(&endpoints, name_of(peers[i]->proc));
            xsbtl_remove(xensock_module.engine, peers[i]->id);
            free(peers[i]);
            peers[i] = NULL;
        }
    }
    return OPAL_SUCCESS;
}

static int xensock_register_error(mca_btl_base_module_t *btl,
                                  mca_btl_base_module_error_cb_fn_t cbfunc)
{
    (void) btl;
    xensock_module.error_cb = cbfunc;
    return OPAL_SUCCESS;
}

static int xensock_finalize(mca_btl_base_module_t *btl)
{
    uint64_t key;
    void *ep, *node;
    (void) btl;
    if (NULL != xensock_module.engine) {
        xsbtl_close(xensock_module.engine);
        xensock_module.engine = NULL;
    }
    /* endpoints Open MPI never removed (peers it never used itself) */
    if (OPAL_SUCCESS == opal_hash_table_get_first_key_uint64(&endpoints, &key, &ep, &node)) {
        do {
            free(ep);
        } while (OPAL_SUCCESS
                 == opal_hash_table_get_next_key_uint64(&endpoints, &key, &ep, node, &node));
    }
    OBJ_DESTRUCT(&eager_frags);
    OBJ_DESTRUCT(&max_frags);
    OBJ_DESTRUCT(&endpoints);
    return OPAL_SUCCESS;
}

static mca_btl_base_descriptor_t *xensock_alloc(mca_btl_base_module_t *btl,
                                                struct mca_btl_base_endpoint_t *endpoint,
                                                uint8_t order, size_t size, uint32_t flags)
{
    opal_free_list_t *list;
    xensock_frag_t *frag;
    (void) order;
    if (size <= btl->btl_eager_limit) {
        list = &eager_frags;
    } else if (size <= btl->btl_max_send_size) {
        list = &max_frags;
    } else {
        return NULL;
    }
    frag = (xensock_frag_t *) opal_free_list_get(list);
    if (NULL == frag) {
        return NULL;
    }
    frag->list = list;
    frag->data = (unsigned char *) (frag + 1);
    frag->endpoint = endpoint;
    frag->segments[0].seg_addr.pval = frag->data;
    frag->segments[0].seg_len = size;
    frag->base.des_segments = frag->segments;
    frag->base.des_segment_count = 1;
    frag->base.des_flags = flags;
    frag->base.des_cbfunc = NULL;
    frag->base.order = MCA_BTL_NO_ORDER;
    return &frag->base;
}

static int xensock_free(mca_btl_base_module_t *btl, mca_btl_base_descriptor_t *des)
{
    xensock_frag_t *frag = (xensock_frag_t *) des;
    (void) btl;
    opal_free_list_return(frag->list, &frag->base.super);
    return OPAL_SUCCESS;
}

static mca_btl_base_descriptor_t *xensock_prepare_src(mca_btl_base_module_t *btl,
                                                      struct mca_btl_base_endpoint_t *endpoint,
                                                      opal_convertor_t *convertor, uint8_t order,
                                                      size_t reserve, size_t *size,
                                                      uint32_t flags)
{
    bool in_place = !opal_convertor_need_buffers(convertor);
    size_t max_data = *size;
    uint32_t iov_count = 1;
    struct iovec iov;
    xensock_frag_t *frag;

    if (reserve + max_data > btl->btl_max_send_size) {
        max_data = btl->btl_max_send_size - reserve;
    }
    frag = (xensock_frag_t *) xensock_alloc(btl, endpoint, order,
                                            reserve + (in_place ? 0 : max_data), flags);
    if (NULL == frag) {
        return NULL;
    }
    if (in_place) {
        /* The user's buffer goes out as the second segment; the engine
         * keeps it by reference until the send completes. */
        iov.iov_base = NULL;
        iov.iov_len = max_data;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &max_data) < 0) {
            xensock_free(btl, &frag->base);
            return NULL;
        }
        frag->segments[0].seg_len = reserve;
        frag->segments[1].seg_addr.pval = iov.iov_base;
        frag->segments[1].seg_len = max_data;
        frag->base.des_segment_count = 2;
    } else {
        iov.iov_base = (IOVBASE_TYPE *) (frag->data + reserve);
        iov.iov_len = max_data;
        if (opal_convertor_pack(convertor, &iov, &iov_count, &max_data) < 0) {
            xensock_free(btl, &frag->base);
            return NULL;
        }
        frag->segments[0].seg_len = reserve + max_data;
    }
    *size = max_data;
    return &frag->base;
}

static int xensock_send(mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                        mca_btl_base_descriptor_t *des, mca_btl_base_tag_t tag)
{
    xensock_frag_t *frag = (xensock_frag_t *) des;
    struct iovec iov[2];
    char why[256] = "";
    int owned = des->des_flags & MCA_BTL_DES_FLAGS_BTL_OWNERSHIP;
    int rc;

    frag->endpoint = endpoint;
    for (size_t i = 0; i < des->des_segment_count && i < 2; i++) {
        iov[i].iov_base = des->des_segments[i].seg_addr.pval;
        iov[i].iov_len = des->des_segments[i].seg_len;
    }
    rc = xsbtl_send(xensock_module.engine, endpoint->id, tag, iov, (int) des->des_segment_count,
                    frag, why, sizeof(why));
    if (rc < 0) {
        VERBOSE(1, "send to %s: %s", OPAL_NAME_PRINT(endpoint->proc->proc_name), why);
        return OPAL_ERR_UNREACH;
    }
    if (0 == rc) {
        return OPAL_SUCCESS; /* completes from progress */
    }
    if ((des->des_flags & MCA_BTL_DES_SEND_ALWAYS_CALLBACK) && NULL != des->des_cbfunc) {
        des->des_cbfunc(btl, endpoint, des, OPAL_SUCCESS);
    }
    if (owned) {
        xensock_free(btl, des);
    }
    return 1;
}

static int xensock_sendi(mca_btl_base_module_t *btl, struct mca_btl_base_endpoint_t *endpoint,
                         opal_convertor_t *convertor, void *header, size_t header_size,
                         size_t payload_size, uint8_t order, uint32_t flags,
                         mca_btl_base_tag_t tag, mca_btl_base_descriptor_t **descriptor)
{
    struct iovec iov[2] = {{.iov_base = header, .iov_len = header_size}};
    int iovcnt = 1;
    char why[256] = "";
    if (NULL != descriptor) {
        *descriptor = NULL;
    }
    if (header_size + payload_size > btl->btl_eager_limit) {
        return OPAL_ERR_OUT_OF_RESOURCE;
    }
    if (payload_size > 0) {
        uint32_t iov_count = 1;
        size_t max_data = payload_size;
        if (opal_convertor_need_buffers(convertor)) {
            /* Non-contiguous data is packed into a fragment after the
             * header, and the fragment sent as send would. */
            mca_btl_base_descriptor_t *des = xensock_prepare_src(
                btl, endpoint, convertor, order, header_size, &payload_size,
                flags | MCA_BTL_DES_FLAGS_BTL_OWNERSHIP);
            int rc;
            if (NULL == des) {
                return OPAL_ERR_OUT_OF_RESOURCE;
            }
            memcpy(des->des_segments[0].seg_addr.pval, header, header_size);
            rc = xensock_send(btl, endpoint, des, tag);
            if (rc < 0) {
                xensock_free(btl, des);
                return rc;
            }
            return OPAL_SUCCESS;
        } else {
            iov[1].iov_base = NULL;
            iov[1].iov_len = payload_size;
            if (opal_convertor_pack(convertor, &iov[1], &iov_count, &max_data) < 0) {
                return OPAL_ERROR;
            }
            iov[1].iov_len = max_data;
            iovcnt = 2;
        }
    }
    /* No cookie: what cannot leave now is copied, so the caller's
     * buffers are free when this returns. */
    if (xsbtl_send(xensock_module.engine, endpoint->id, tag, iov, iovcnt, NULL, why,
                   sizeof(why)) < 0) {
        VERBOSE(1, "sendi to %s: %s", OPAL_NAME_PRINT(endpoint->proc->proc_name), why);
        return OPAL_ERR_UNREACH;
    }
    return OPAL_SUCCESS;
}

static mca_btl_xensock_module_t xensock_module = {
    .super = {
        .btl_component = &mca_btl_xensock_component,
        .btl_add_procs = xensock_add_procs,
        .btl_del_procs = xensock_del_procs,
        .btl_finalize = xensock_finalize,
        .btl_alloc = xensock_alloc,
        .btl_free = xensock_free,
        .btl_prepare_src = xensock_prepare_src,
        .btl_send = xensock_send,
        .btl_sendi = xensock_sendi,
        .btl_dump = mca_btl_base_dump,
        .btl_register_error = xensock_register_error,
    },
};

/* ---- component ---- */

static void param(mca_base_component_t *c, const char *name, const char *what,
                  mca_base_var_type_t type, mca_base_var_info_lvl_t level, void *storage)
{
    (void) mca_base_component_var_register(c, name, what, type, NULL, 0, 0, level,
                                           MCA_BASE_VAR_SCOPE_READONLY, storage);
}

static int xensock_register(void)
{
    mca_base_component_t *c = &mca_btl_xensock_component.btl_version;

    (void) mca_base_var_group_component_register(c, "xensock: ranks in co-resident Xen guests");
    param(c, "recv_buffer_kib", "Receive ring of each connection in KiB (0: the backend's default)",
          MCA_BASE_VAR_TYPE_UNSIGNED_INT, OPAL_INFO_LVL_5, &recv_buffer_kib);
    param(c, "linger_ms", "At finalize, how long to wait for queued fragments to leave (ms)",
          MCA_BASE_VAR_TYPE_UNSIGNED_INT, OPAL_INFO_LVL_9, &linger_ms);
    param(c, "check_readable",
          "Over af_xen.ko, ask FIONREAD before each read: an empty poll then costs the peer no "
          "event-channel kick, a message one more system call",
          MCA_BASE_VAR_TYPE_BOOL, OPAL_INFO_LVL_9, &check_readable);
    param(c, "free_list_max", "Most send fragments of each size held at once",
          MCA_BASE_VAR_TYPE_INT, OPAL_INFO_LVL_9, &free_list_max);

    /* Above tcp (100), below vader and sm: ranks in one guest share memory
     * directly, ranks on other hosts need tcp. */
    xensock_module.super.btl_exclusivity = MCA_BTL_EXCLUSIVITY_DEFAULT;
    /* Fragment sizes from the lab's sweeps (MPI_SWEEP=1 lab/run mpi, README
     * "MPI"): 256 KiB fragments moved the most bytes per second at 1 and
     * 4 MiB over two runs, and a 128 KiB eager limit sends 64 KiB messages
     * in one go, at less than half the latency of the rendezvous that a
     * 64 KiB limit (the header included) makes them take. */
    xensock_module.super.btl_eager_limit = 128 * 1024;
    xensock_module.super.btl_rndv_eager_limit = 128 * 1024;
    xensock_module.super.btl_max_send_size = 256 * 1024;
    xensock_module.super.btl_rdma_pipeline_send_length = 256 * 1024;
    xensock_module.super.btl_rdma_pipeline_frag_size = 256 * 1024;
    xensock_module.super.btl_min_rdma_pipeline_size = 0;
    xensock_module.super.btl_flags = MCA_BTL_FLAGS_SEND | MCA_BTL_FLAGS_SEND_INPLACE;
    xensock_module.super.btl_latency = 1;
    xensock_module.super.btl_bandwidth = 20000;
    return mca_btl_base_param_register(c, &xensock_module.super);
}

static int xensock_open(void)
{
    OBJ_CONSTRUCT(&eager_frags, opal_free_list_t);
    OBJ_CONSTRUCT(&max_frags, opal_free_list_t);
    OBJ_CONSTRUCT(&endpoints, opal_hash_table_t);
    return opal_hash_table_init(&endpoints, 64);
}

static int xensock_close(void)
{
    return OPAL_SUCCESS;
}

static mca_btl_base_module_t **xensock_init(int *num_btls, bool progress_threads, bool mpi_threads)
{
    static const struct xsbtl_callbacks callbacks = {
        .deliver = on_deliver,
        .completed = on_completed,
        .failed = on_failed,
        .note = on_note,
        .unknown_rank = on_unknown_rank,
    };
    struct xsbtl_config cfg;
    mca_btl_base_module_t **btls;
    char line[512] = "";
    uint8_t card[1024];
    size_t card_len;
    int rc;

    (void) progress_threads;
    (void) mpi_threads; /* the engine serializes threads itself */
    *num_btls = 0;
    if (xensock_module.super.btl_eager_limit > xensock_module.super.btl_max_send_size) {
        xensock_module.super.btl_eager_limit = xensock_module.super.btl_max_send_size;
    }
    cfg.max_payload = xensock_module.super.btl_max_send_size;
    cfg.recv_buffer = (size_t) recv_buffer_kib * 1024;
    cfg.linger_ms = linger_ms;
    cfg.check_readable = check_readable;
    xensock_module.engine = xsbtl_open(name_of(opal_proc_local_get()), &cfg, &callbacks, line,
                                       sizeof(line));
    if (NULL == xensock_module.engine) {
        VERBOSE(5, "not used: %s", line);
        return NULL;
    }
    xsbtl_describe(xensock_module.engine, line, sizeof(line));
    VERBOSE(5, "listening: %s", line);

    card_len = xsbtl_card(xensock_module.engine, card, sizeof(card));
    if (card_len > sizeof(card)) {
        goto fail;
    }
    OPAL_MODEX_SEND(rc, OPAL_PMIX_GLOBAL, &mca_btl_xensock_component.btl_version, card, card_len);
    if (OPAL_SUCCESS != rc) {
        VERBOSE(5, "not used: modex send failed (%d)", rc);
        goto fail;
    }
    if (OPAL_SUCCESS != opal_free_list_init(&eager_frags,
                                            sizeof(xensock_frag_t) + xensock_module.super.btl_eager_limit,
                                            opal_cache_line_size, OBJ_CLASS(xensock_frag_t), 0,
                                            opal_cache_line_size, 8, free_list_max, 8, NULL, 0,
                                            NULL, NULL, NULL)
        || OPAL_SUCCESS != opal_free_list_init(&max_frags,
                                               sizeof(xensock_frag_t) + xensock_module.super.btl_max_send_size,
                                               opal_cache_line_size, OBJ_CLASS(xensock_frag_t), 0,
                                               opal_cache_line_size, 4, free_list_max, 4, NULL, 0,
                                               NULL, NULL, NULL)) {
        goto fail;
    }
    btls = malloc(sizeof(*btls));
    if (NULL == btls) {
        goto fail;
    }
    btls[0] = &xensock_module.super;
    *num_btls = 1;
    return btls;

fail:
    xsbtl_close(xensock_module.engine);
    xensock_module.engine = NULL;
    return NULL;
}

static int xensock_progress(void)
{
    if (NULL == xensock_module.engine) {
        return 0;
    }
    return xsbtl_progress(xensock_module.engine);
}
