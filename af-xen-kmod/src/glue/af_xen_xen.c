// SPDX-License-Identifier: GPL-2.0
/*
 * Inter-domain plumbing: event channels, grants, mappings, XenStore and one
 * module-wide work item. Interrupts and watch callbacks only schedule the
 * work; the work (Rust, afx_rs_work) drains control rings and wakes sockets.
 */
#include <linux/delay.h>
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/socket.h>
#include <linux/vmalloc.h>
#include <xen/xen.h>
#include <linux/workqueue.h>
#include <linux/interrupt.h>
#include <linux/slab.h>
#include <xen/grant_table.h>
#include <xen/events.h>
#include <xen/xenbus.h>
#include <xen/interface/event_channel.h>
#include <asm/xen/hypercall.h>
#include <asm/xen/page.h>
#include <asm/pgtable_types.h>
#include <xen/page.h>
#include "af_xen_glue.h"

/* the largest ring: 4 MiB of data pages (proto's MAX_RING_ORDER 22) */
#define AFX_MAX_RING_PAGES 1024

void afx_rs_work(void);	/* Rust (sys/entry.rs: link/table.rs work) */
static void afx_work_fn(struct work_struct *w) { afx_rs_work(); }
static DECLARE_WORK(afx_work, afx_work_fn);
void afx_schedule(void) { schedule_work(&afx_work); }
void afx_cancel_work(void) { cancel_work_sync(&afx_work); }
/*
 * Receive rings lent after close (link/lent.rs): a delayed work ends
 * those whose peer never said it is done with them (Rust: afx_rs_reap).
 */
void afx_rs_reap(void);
static void afx_reap_fn(struct work_struct *w) { afx_rs_reap(); }
static DECLARE_DELAYED_WORK(afx_reap, afx_reap_fn);
/* queues the reap in `ms`, or moves a queued one earlier (never later) */
void afx_schedule_reap(unsigned int ms)
{
	unsigned long delay = msecs_to_jiffies(ms);

	if (!delayed_work_pending(&afx_reap) || time_before(jiffies + delay, READ_ONCE(afx_reap.timer.expires)))
		mod_delayed_work(system_wq, &afx_reap, delay);
}
void afx_cancel_reap(void) { cancel_delayed_work_sync(&afx_reap); }

int afx_evtchn_alloc_unbound(unsigned int remote, unsigned int *port)
{
	struct evtchn_alloc_unbound a = { .dom = DOMID_SELF, .remote_dom = remote };
	int err = HYPERVISOR_event_channel_op(EVTCHNOP_alloc_unbound, &a);

	if (!err)
		*port = a.port;
	return err;
}

int afx_evtchn_bind_interdomain(unsigned int remote, unsigned int rport, unsigned int *lport)
{
	struct evtchn_bind_interdomain b = { .remote_dom = remote, .remote_port = rport };
	int err = HYPERVISOR_event_channel_op(EVTCHNOP_bind_interdomain, &b);

	if (!err)
		*lport = b.local_port;
	return err;
}

void afx_evtchn_close(unsigned int port)
{
	struct evtchn_close c = { .port = port };

	HYPERVISOR_event_channel_op(EVTCHNOP_close, &c);
}

/* irq >= 0 or -errno; unbind_from_irqhandler also closes the port */
/*
 * The event-channel interrupt: handler and cookie come from Rust
 * (sys/mod.rs, Evtchn); the cookie stays alive while the irq is bound.
 */
int afx_bind_irq(unsigned int port, irq_handler_t handler, void *cookie)
{
	return bind_evtchn_to_irqhandler(port, handler, 0, "af_xen", cookie);
}
void afx_unbind_irq(int irq, void *cookie) { unbind_from_irqhandler(irq, cookie); }
/* an irq-safe spinlock for Rust (kernel::sync has none in 6.12): see sys/mod.rs IrqSaveBackend */
unsigned long afx_spin_lock_irqsave(spinlock_t *l) { unsigned long f; spin_lock_irqsave(l, f); return f; }
void afx_spin_unlock_irqrestore(spinlock_t *l, unsigned long f) { spin_unlock_irqrestore(l, f); }
void afx_notify(unsigned int port) { notify_remote_via_evtchn(port); }

/* one zeroed page granted read-write to domid */
void *afx_grant_page(unsigned int domid, unsigned int *ref)
{
	void *p = (void *)get_zeroed_page(GFP_KERNEL);
	int r;

	if (!p)
		return NULL;
	r = gnttab_grant_foreign_access(domid, virt_to_gfn(p), 0);
	if (r < 0) {
		free_page((unsigned long)p);
		return NULL;
	}
	*ref = r;
	return p;
}

/*
 * Grants whose peer still maps the page when we end them. Linux's
 * gnttab_end_foreign_access() would put them on its own deferred list,
 * which retries free_per_iteration (10) entries a second: a connection's
 * 1 MiB ring is 258 entries, so a client that closed before its server
 * (which unmaps the ring only when it closes too) got its memory back
 * minutes later, and a few hundred such connections filled the grant
 * table (ENOMEM on every later connect). We keep them here instead and try
 * every one of them again each AFX_PENDING_MS, and at once when the peer
 * says it is done (afx_pending_kick), until the peer unmaps them (its own
 * close, or Xen when it dies).
 */
#define AFX_PENDING_MS 200
struct afx_pending {
	struct list_head list;
	grant_ref_t ref;
	struct page *page;
};
static LIST_HEAD(afx_pending_list);
static DEFINE_SPINLOCK(afx_pending_lock);
/* entries on the list now, and ever put on it (/proc/net/af_xen_stats) */
static atomic_long_t afx_pending_now = ATOMIC_LONG_INIT(0);
static atomic_long_t afx_pending_total = ATOMIC_LONG_INIT(0);
static void afx_pending_fn(struct work_struct *w);
static DECLARE_DELAYED_WORK(afx_pending_work, afx_pending_fn);
static bool afx_pending_stopping;

long afx_grants_pending(void) { return atomic_long_read(&afx_pending_now); }
long afx_grants_pended(void) { return atomic_long_read(&afx_pending_total); }

/* ends one grant and frees its page, or keeps both until the peer unmaps */
static void afx_end_one(grant_ref_t ref, struct page *page)
{
	struct afx_pending *e;
	gfp_t gfp = (in_atomic() || irqs_disabled()) ? GFP_ATOMIC : GFP_KERNEL;
	unsigned long f;

	if (gnttab_try_end_foreign_access(ref)) {
		put_page(page);
		return;
	}
	e = kmalloc(sizeof(*e), gfp);
	if (!e) {
		/* Linux's deferred list, slow but safe */
		gnttab_end_foreign_access(ref, page);
		return;
	}
	e->ref = ref;
	e->page = page;
	spin_lock_irqsave(&afx_pending_lock, f);
	list_add_tail(&e->list, &afx_pending_list);
	/* queue_ (not mod_): a stream of new entries must not keep the pass away */
	if (!afx_pending_stopping)
		queue_delayed_work(system_wq, &afx_pending_work, msecs_to_jiffies(AFX_PENDING_MS));
	spin_unlock_irqrestore(&afx_pending_lock, f);
	atomic_long_inc(&afx_pending_now);
	atomic_long_inc(&afx_pending_total);
}

/* one pass over the pending grants; true if some are left */
static bool afx_pending_pass(void)
{
	struct afx_pending *e, *n;
	LIST_HEAD(todo);
	unsigned long f;
	bool left;

	spin_lock_irqsave(&afx_pending_lock, f);
	list_splice_init(&afx_pending_list, &todo);
	spin_unlock_irqrestore(&afx_pending_lock, f);
	list_for_each_entry_safe(e, n, &todo, list) {
		if (!gnttab_try_end_foreign_access(e->ref))
			continue;
		list_del(&e->list);
		put_page(e->page);
		kfree(e);
		atomic_long_dec(&afx_pending_now);
	}
	spin_lock_irqsave(&afx_pending_lock, f);
	list_splice(&todo, &afx_pending_list);
	left = !list_empty(&afx_pending_list);
	spin_unlock_irqrestore(&afx_pending_lock, f);
	return left;
}

static void afx_pending_fn(struct work_struct *w)
{
	unsigned long f;

	if (!afx_pending_pass())
		return;
	spin_lock_irqsave(&afx_pending_lock, f);
	if (!afx_pending_stopping)
		queue_delayed_work(system_wq, &afx_pending_work, msecs_to_jiffies(AFX_PENDING_MS));
	spin_unlock_irqrestore(&afx_pending_lock, f);
}

/* the peer said it is done with a connection or went away: try now */
void afx_pending_kick(void)
{
	unsigned long f;

	spin_lock_irqsave(&afx_pending_lock, f);
	if (!afx_pending_stopping && !list_empty(&afx_pending_list))
		mod_delayed_work(system_wq, &afx_pending_work, 0);
	spin_unlock_irqrestore(&afx_pending_lock, f);
}

/*
 * Module exit: what a peer still maps goes to Linux's deferred list, which
 * outlives the module (it holds the page, and no code of ours).
 */
void afx_pending_exit(void)
{
	struct afx_pending *e, *n;
	unsigned long f;

	spin_lock_irqsave(&afx_pending_lock, f);
	afx_pending_stopping = true;
	spin_unlock_irqrestore(&afx_pending_lock, f);
	cancel_delayed_work_sync(&afx_pending_work);
	afx_pending_pass();
	list_for_each_entry_safe(e, n, &afx_pending_list, list) {
		list_del(&e->list);
		gnttab_end_foreign_access(e->ref, e->page);
		kfree(e);
		atomic_long_dec(&afx_pending_now);
	}
}

/* revoke and free (kept pending while the peer maps it) */
void afx_end_grant(unsigned int ref, void *p)
{
	afx_end_one(ref, virt_to_page(p));
}

struct afx_map {
	struct page *page;
	grant_handle_t handle;
	void *addr;
};

/*
 * Maps of a peer's grant that Xen refused (/proc/net/af_xen_stats
 * map_failures). A peer that offers grants and goes away before they are
 * mapped (clients that vanish mid-connect) makes every one fail: counted
 * here, logged at most a few times a second, so a peer cannot flood the log.
 */
static atomic_long_t afx_map_failed = ATOMIC_LONG_INIT(0);
long afx_map_failures(void) { return atomic_long_read(&afx_map_failed); }

void *afx_map_page(unsigned int domid, unsigned int ref, void **cookie)
{
	struct afx_map *m = kzalloc(sizeof(*m), GFP_KERNEL);
	struct gnttab_map_grant_ref op;

	if (!m)
		return NULL;
	if (gnttab_alloc_pages(1, &m->page)) {
		kfree(m);
		return NULL;
	}
	m->addr = pfn_to_kaddr(page_to_pfn(m->page));
	gnttab_set_map_op(&op, (unsigned long)m->addr, GNTMAP_host_map, ref, domid);
	if (gnttab_map_refs(&op, NULL, &m->page, 1) || op.status != GNTST_okay) {
		atomic_long_inc(&afx_map_failed);
		pr_warn_ratelimited("af_xen: map of grant %u from dom%u failed (status %d)\n",
				    ref, domid, op.status);
		gnttab_free_pages(1, &m->page);
		kfree(m);
		return NULL;
	}
	m->handle = op.handle;
	*cookie = m;
	return m->addr;
}

void afx_unmap_page(void *cookie)
{
	struct afx_map *m = cookie;
	struct gnttab_unmap_grant_ref u;

	gnttab_set_unmap_op(&u, (unsigned long)m->addr, GNTMAP_host_map, m->handle);
	if (gnttab_unmap_refs(&u, NULL, &m->page, 1) || u.status != GNTST_okay)
		pr_warn("af_xen: unmap failed (status %d)\n", u.status);
	gnttab_free_pages(1, &m->page);
	kfree(m);
}

/*
 * Our nodes in a link directory, in one transaction (EAGAIN: retry).
 * The link directory is dom0's (the agent's): it makes it with the
 * permissions that let the peer read it, and our nodes inherit them. A
 * write after dom0 removed it would create it again with the link root's
 * owner-only permissions, which the peer cannot read, and dom0's making
 * it again would not change our nodes' (a directory listing taken before the removal, then readvertise; the
 * peer stayed at state 3). So every write checks, in its transaction, that
 * the directory is there; -ENOENT if not.
 */
static int afx_xs_write_link(const char *dir, bool whole, unsigned int ref, unsigned int port, int state)
{
	struct xenbus_transaction t;
	int err;
again:
	err = xenbus_transaction_start(&t);
	if (err)
		return err;
	err = xenbus_exists(t, dir, "") ? 0 : -ENOENT;
	if (!err && whole)
		err = xenbus_printf(t, dir, "version", "%u", 1);
	if (!err && whole)
		err = xenbus_printf(t, dir, "ring-ref", "%u", ref);
	if (!err && whole)
		err = xenbus_printf(t, dir, "event-channel", "%u", port);
	if (!err)
		err = xenbus_printf(t, dir, "state", "%d", state);
	if (err) {
		xenbus_transaction_end(t, 1);
		return err;
	}
	err = xenbus_transaction_end(t, 0);
	if (err == -EAGAIN)
		goto again;
	return err;
}

/* our whole advertisement (version, ring-ref, event-channel, state) */
int afx_xs_advertise(const char *dir, unsigned int ref, unsigned int port, int state)
{
	return afx_xs_write_link(dir, true, ref, port, state);
}

int afx_xs_write_state(const char *dir, int state)
{
	return afx_xs_write_link(dir, false, 0, 0, state);
}

/* unload: state 6, advertisement gone (the directory is dom0's: it stays) */
void afx_xs_retract(const char *dir)
{
	/* a directory dom0 removed is not made again (see afx_xs_advertise) */
	if (!xenbus_exists(XBT_NIL, dir, ""))
		return;
	xenbus_rm(XBT_NIL, dir, "ring-ref");
	xenbus_rm(XBT_NIL, dir, "event-channel");
	xenbus_printf(XBT_NIL, dir, "state", "%d", 6);
}

int afx_xs_read_uint(const char *dir, const char *node, unsigned int *out)
{
	int n = xenbus_scanf(XBT_NIL, dir, node, "%u", out);

	return n == 1 ? 0 : (n < 0 ? n : -EINVAL);
}

/* numeric entries of dir into out[0..max); count or -errno */
int afx_xs_dir_ids(const char *dir, unsigned int *out, int max)
{
	unsigned int n, i;
	int k = 0;
	char **names = xenbus_directory(XBT_NIL, dir, "", &n);

	if (IS_ERR(names))
		return PTR_ERR(names);
	for (i = 0; i < n && k < max; i++) {
		unsigned int v;

		if (kstrtouint(names[i], 10, &v) == 0)
			out[k++] = v;
	}
	kfree(names);
	return k;
}

struct afx_watch {
	struct xenbus_watch w;
};

/* set by watches: the work re-reads XenStore only then (never per interrupt) */
static atomic_t afx_xs_dirty = ATOMIC_INIT(1);
int afx_take_xs_dirty(void) { return atomic_xchg(&afx_xs_dirty, 0); }

static void afx_watch_cb(struct xenbus_watch *w, const char *path, const char *token)
{
	atomic_set(&afx_xs_dirty, 1);
	schedule_work(&afx_work);
}

void *afx_watch_add(const char *path)
{
	struct afx_watch *aw = kzalloc(sizeof(*aw), GFP_KERNEL);

	if (!aw)
		return NULL;
	aw->w.node = kstrdup(path, GFP_KERNEL);
	aw->w.callback = afx_watch_cb;
	if (!aw->w.node || register_xenbus_watch(&aw->w)) {
		kfree(aw->w.node);
		kfree(aw);
		return NULL;
	}
	return aw;
}

void afx_watch_del(void *p)
{
	struct afx_watch *aw = p;

	unregister_xenbus_watch(&aw->w);
	kfree(aw->w.node);
	kfree(aw);
}

/*
 * Rings larger than one page (up to 1024 data pages, 4 MiB).
 *
 * Granting: the receiver's data pages are allocated one by one (a 4 MiB
 * physically contiguous allocation fails on a fragmented guest), each
 * granted to the peer, and vmap()ed for a contiguous view of our own pages.
 * On release each page goes back through gnttab_end_foreign_access(),
 * which frees it once the peer has unmapped it.
 *
 * Mapping: xenbus_map_ring_valloc() stops at XENBUS_MAX_RING_GRANTS (16)
 * pages, so we map the peer's pages ourselves, the way it does inside:
 *  - PV (the lab's domUs): a PV guest may not point an ordinary PTE at a
 *    foreign frame, so vmap() of grant-mapped pages is refused by Xen. We
 *    reserve the virtual range with a vmap() of PAGE_NONE (non-present)
 *    PTEs of a scratch page -- which also allocates the page tables (no
 *    exported call does only that) -- and let Xen write the grant mappings into
 *    those PTEs (GNTMAP_contains_pte with each PTE's machine address:
 *    xenbus_map_ring_pv's method; get_vm_area() is not exported). Nothing
 *    was ever present there, so no stale TLB entry can exist.
 *  - HVM/PVH: grant-map into ballooned pages (gnttab_alloc_pages +
 *    gnttab_map_refs) and vmap() them, as xenbus_map_ring_hvm does.
 * Every failure path unmaps what was mapped and frees what was allocated.
 *
 * The grant and mapping counters of /proc/net/af_xen_stats are kept by the
 * Rust wrappers (sys/counters.rs); a mapping that fails part way counts
 * nothing.
 */
struct afx_gpages {
	unsigned int n;
	void *addr;
	struct page *pages[];
};

void *afx_grant_pages(unsigned int domid, unsigned int n, unsigned int *refs, void **cookie)
{
	struct afx_gpages *g;
	unsigned int i, granted = 0;

	if (n == 0 || n > AFX_MAX_RING_PAGES)
		return NULL;
	g = kvzalloc(struct_size(g, pages, n), GFP_KERNEL);
	if (!g)
		return NULL;
	g->n = n;
	for (i = 0; i < n; i++) {
		g->pages[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!g->pages[i])
			goto fail;
	}
	for (granted = 0; granted < n; granted++) {
		int r = gnttab_grant_foreign_access(domid, xen_page_to_gfn(g->pages[granted]), 0);

		if (r < 0)
			goto fail;
		refs[granted] = r;
	}
	g->addr = vmap(g->pages, n, VM_MAP, PAGE_KERNEL);
	if (!g->addr)
		goto fail;
	*cookie = g;
	return g->addr;
fail:
	for (i = 0; i < n; i++) {
		if (!g->pages[i])
			continue;
		if (i < granted)
			gnttab_end_foreign_access(refs[i], g->pages[i]);	/* frees the page */
		else
			__free_page(g->pages[i]);
	}
	kvfree(g);
	return NULL;
}

void afx_end_grants(const unsigned int *refs, void *cookie)
{
	struct afx_gpages *g = cookie;
	unsigned int i;

	vunmap(g->addr);
	for (i = 0; i < g->n; i++)
		afx_end_one(refs[i], g->pages[i]);
	kvfree(g);
}

struct afx_fmap {
	unsigned int n;
	void *addr;
	struct page *scratch;	/* PV: backs the PAGE_NONE reservation */
	struct page **pages;	/* HVM: ballooned pages */
	grant_handle_t handles[];
};

unsigned int afx_max_map_pages(void) { return AFX_MAX_RING_PAGES; }

/* PV: machine address of the PTE that maps kernel address va */
static int afx_pte_maddr(unsigned long va, phys_addr_t *maddr)
{
	unsigned int level;
	pte_t *pte = lookup_address(va, &level);

	if (!pte || level != PG_LEVEL_4K)
		return -EFAULT;
	*maddr = arbitrary_virt_to_machine(pte).maddr;
	return 0;
}

/* unmap every grant of m that has a valid handle; returns how many failed */
static unsigned int afx_unmap_grants(struct afx_fmap *m)
{
	struct gnttab_unmap_grant_ref *u;
	struct page **pp = NULL;
	unsigned int i, k = 0, bad = 0;

	u = kvcalloc(m->n, sizeof(*u), GFP_KERNEL);
	if (!m->scratch)
		pp = kvcalloc(m->n, sizeof(*pp), GFP_KERNEL);
	if (!u || (!m->scratch && !pp)) {
		kvfree(u);
		kvfree(pp);
		pr_alert("af_xen: no memory to unmap %u ring page(s): leaking them\n", m->n);
		return m->n;
	}
	for (i = 0; i < m->n; i++) {
		phys_addr_t maddr;

		if (m->handles[i] == INVALID_GRANT_HANDLE)
			continue;
		if (m->scratch) {
			if (afx_pte_maddr((unsigned long)m->addr + i * PAGE_SIZE, &maddr)) {
				bad++;
				continue;
			}
			gnttab_set_unmap_op(&u[k], maddr, GNTMAP_host_map | GNTMAP_contains_pte, m->handles[i]);
		} else {
			gnttab_set_unmap_op(&u[k], (unsigned long)pfn_to_kaddr(page_to_pfn(m->pages[i])),
					    GNTMAP_host_map, m->handles[i]);
			pp[k] = m->pages[i];
		}
		k++;
	}
	if (k) {
		int r = m->scratch ? HYPERVISOR_grant_table_op(GNTTABOP_unmap_grant_ref, u, k)
				   : gnttab_unmap_refs(u, NULL, pp, k);

		if (r) {
			pr_alert("af_xen: unmapping %u ring page(s) failed (%d)\n", k, r);
			bad += k;
		} else {
			for (i = 0; i < k; i++) {
				if (u[i].status != GNTST_okay) {
					pr_warn("af_xen: unmap of a ring page failed (status %d)\n", u[i].status);
					bad++;
				}
			}
		}
	}
	kvfree(pp);
	kvfree(u);
	return bad;
}

/* frees m; with leak set, a page may still be mapped: keep its memory */
static void afx_fmap_free(struct afx_fmap *m, bool leak)
{
	if (leak) {
		pr_alert("af_xen: leaking a ring mapping of %u page(s)\n", m->n);
		return;
	}
	if (m->addr)
		vunmap(m->addr);
	if (m->scratch)
		__free_page(m->scratch);
	if (m->pages) {
		gnttab_free_pages(m->n, m->pages);
		kvfree(m->pages);
	}
	kvfree(m);
}

void *afx_map_pages(unsigned int domid, unsigned int n, const unsigned int *refs, void **cookie)
{
	struct gnttab_map_grant_ref *ops;
	struct afx_fmap *m;
	unsigned int i;
	bool ok = true;

	if (n == 0 || n > AFX_MAX_RING_PAGES)
		return NULL;
	m = kvzalloc(struct_size(m, handles, n), GFP_KERNEL);
	ops = kvcalloc(n, sizeof(*ops), GFP_KERNEL);
	if (!m || !ops)
		goto nomem;
	m->n = n;
	for (i = 0; i < n; i++)
		m->handles[i] = INVALID_GRANT_HANDLE;

	if (xen_pv_domain()) {
		struct page **tmp = kvmalloc_array(n, sizeof(*tmp), GFP_KERNEL);

		m->scratch = alloc_page(GFP_KERNEL);
		if (!tmp || !m->scratch) {
			kvfree(tmp);
			goto nomem;
		}
		for (i = 0; i < n; i++)
			tmp[i] = m->scratch;
		m->addr = vmap(tmp, n, VM_MAP, PAGE_NONE);
		kvfree(tmp);
		if (!m->addr)
			goto nomem;
		for (i = 0; i < n; i++) {
			phys_addr_t maddr;

			if (afx_pte_maddr((unsigned long)m->addr + i * PAGE_SIZE, &maddr))
				goto nomem;
			gnttab_set_map_op(&ops[i], maddr, GNTMAP_host_map | GNTMAP_contains_pte, refs[i], domid);
		}
		gnttab_batch_map(ops, n);
	} else {
		m->pages = kvcalloc(n, sizeof(*m->pages), GFP_KERNEL);
		if (!m->pages)
			goto nomem;
		if (gnttab_alloc_pages(n, m->pages)) {
			kvfree(m->pages);
			m->pages = NULL;
			goto nomem;
		}
		for (i = 0; i < n; i++)
			gnttab_set_map_op(&ops[i], (unsigned long)pfn_to_kaddr(page_to_pfn(m->pages[i])),
					  GNTMAP_host_map, refs[i], domid);
		if (gnttab_map_refs(ops, NULL, m->pages, n))
			ok = false;
	}
	for (i = 0; i < n; i++) {
		if (ops[i].status == GNTST_okay) {
			m->handles[i] = ops[i].handle;
				} else {
			if (ok) {
				atomic_long_inc(&afx_map_failed);
				pr_warn_ratelimited("af_xen: map of ring page %u (grant %u) from dom%u failed (status %d)\n",
						    i, refs[i], domid, ops[i].status);
			}
			ok = false;
		}
	}
	if (!ok)
		goto unmap;
	if (!m->scratch) {
		m->addr = vmap(m->pages, n, VM_MAP | VM_IOREMAP, PAGE_KERNEL);
		if (!m->addr)
			goto unmap;
	}
	kvfree(ops);
	*cookie = m;
	return m->addr;
unmap:
	kvfree(ops);
	afx_fmap_free(m, afx_unmap_grants(m) != 0);
	return NULL;
nomem:
	kvfree(ops);
	if (m)
		afx_fmap_free(m, false);
	return NULL;
}

void afx_unmap_pages(void *cookie)
{
	struct afx_fmap *m = cookie;

	/* HVM: take our contiguous view away before the pages go */
	if (!m->scratch && m->addr) {
		vunmap(m->addr);
		m->addr = NULL;
	}
	afx_fmap_free(m, afx_unmap_grants(m) != 0);
}
