// SPDX-License-Identifier: GPL-2.0
/*
 * af_xen.ko: the copy routines of the stream data path (user memory <->
 * ring), in C because they are built from uaccess macros and static
 * inlines (user_access_begin, unsafe_get_user/unsafe_put_user, iov_iter
 * internals) that Rust cannot reach. See docs/design.md, "Ring copies".
 *
 * Three routines, chosen per pipe (copy_mode, or XENSOCK_COPY_ROUTINE on a
 * socket):
 *   AFX_COPY_ITER     copy_from_iter / copy_to_iter: the kernel's
 *                     copy_user_generic, i.e. `rep movsb` with FSRM,
 *                     `rep movsq` on CPUs without ERMS (QEMU's qemu64)
 *   AFX_COPY_NOCACHE  ring writes with copy_from_iter_nocache (an unrolled
 *                     movnti loop), reads as AFX_COPY_ITER
 *   AFX_COPY_LOOP     both ways with an unrolled 64-byte loop of 8-byte
 *                     moves inside one user_access_begin/end
 * Every routine copies the same bytes and returns the same count; a fault
 * part way hands the rest to copy_{from,to}_iter, which stops at the exact
 * faulting byte, so what is reported copied is what was copied.
 */
#include <linux/module.h>
#include <linux/moduleparam.h>
#include <linux/uaccess.h>
#include <linux/uio.h>
#include <linux/unaligned.h>
#include "af_xen_copy.h"

static unsigned int copy_mode = AFX_COPY_LOOP;
module_param(copy_mode, uint, 0644);
MODULE_PARM_DESC(copy_mode, "ring copy routine of new connections: 0 = copy_{from,to}_iter, 1 = copy_from_iter_nocache for writes, 2 = unrolled uaccess loop (default; docs/design.md)");

unsigned int afx_copy_mode_default(void)
{
	unsigned int m = READ_ONCE(copy_mode);

	return m <= AFX_COPY_LOOP ? m : AFX_COPY_ITER;
}

/* the current user segment of a user-backed iter: base and length */
static bool afx_user_seg(const struct iov_iter *i, void __user **base, size_t *len)
{
	if (iter_is_ubuf(i)) {
		*base = i->ubuf + i->iov_offset;
		*len = i->count;
		return true;
	}
	if (iter_is_iovec(i) && i->nr_segs) {
		const struct iovec *v = iter_iov(i);

		*base = v->iov_base + i->iov_offset;
		*len = min(v->iov_len - i->iov_offset, i->count);
		return true;
	}
	return false;
}

static size_t afx_loop_to_user(void __user *dst, const void *src, size_t len)
{
	size_t done = 0;

	if (!user_access_begin(dst, len))
		return 0;
	while (len - done >= 64) {
		const void *s = src + done;
		u64 __user *d = dst + done;

		unsafe_put_user(get_unaligned((const u64 *)s), d, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 8)), d + 1, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 16)), d + 2, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 24)), d + 3, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 32)), d + 4, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 40)), d + 5, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 48)), d + 6, out);
		unsafe_put_user(get_unaligned((const u64 *)(s + 56)), d + 7, out);
		done += 64;
	}
	while (len - done >= 8) {
		unsafe_put_user(get_unaligned((const u64 *)(src + done)), (u64 __user *)(dst + done), out);
		done += 8;
	}
out:
	user_access_end();
	return done;
}

static size_t afx_loop_from_user(void *dst, const void __user *src, size_t len)
{
	size_t done = 0;
	u64 a, b, c, d, e, f, g, h;

	if (!user_access_begin(src, len))
		return 0;
	while (len - done >= 64) {
		const u64 __user *s = src + done;
		void *t = dst + done;

		unsafe_get_user(a, s, out);
		unsafe_get_user(b, s + 1, out);
		unsafe_get_user(c, s + 2, out);
		unsafe_get_user(d, s + 3, out);
		unsafe_get_user(e, s + 4, out);
		unsafe_get_user(f, s + 5, out);
		unsafe_get_user(g, s + 6, out);
		unsafe_get_user(h, s + 7, out);
		put_unaligned(a, (u64 *)t);
		put_unaligned(b, (u64 *)(t + 8));
		put_unaligned(c, (u64 *)(t + 16));
		put_unaligned(d, (u64 *)(t + 24));
		put_unaligned(e, (u64 *)(t + 32));
		put_unaligned(f, (u64 *)(t + 40));
		put_unaligned(g, (u64 *)(t + 48));
		put_unaligned(h, (u64 *)(t + 56));
		done += 64;
	}
	while (len - done >= 8) {
		unsafe_get_user(a, (const u64 __user *)(src + done), out);
		put_unaligned(a, (u64 *)(dst + done));
		done += 8;
	}
out:
	user_access_end();
	return done;
}

size_t afx_copy_to_iter(unsigned int mode, const void *src, size_t len, struct iov_iter *i)
{
	size_t n = 0;

	if (mode == AFX_COPY_LOOP) {
		while (n < len) {
			void __user *base;
			size_t seg, want, got;

			if (!afx_user_seg(i, &base, &seg) || !seg)
				break;
			want = min(seg, len - n);
			got = afx_loop_to_user(base, src + n, want);
			iov_iter_advance(i, got);
			n += got;
			if (got < want)
				break;	/* a fault or an 8-byte tail: below */
		}
	}
	if (n < len)
		n += _copy_to_iter(src + n, len - n, i);
	return n;
}

size_t afx_copy_from_iter(unsigned int mode, void *dst, size_t len, struct iov_iter *i)
{
	size_t n = 0;

	if (mode == AFX_COPY_NOCACHE)
		return _copy_from_iter_nocache(dst, len, i);
	if (mode == AFX_COPY_LOOP) {
		while (n < len) {
			void __user *base;
			size_t seg, want, got;

			if (!afx_user_seg(i, &base, &seg) || !seg)
				break;
			want = min(seg, len - n);
			got = afx_loop_from_user(dst + n, base, want);
			iov_iter_advance(i, got);
			n += got;
			if (got < want)
				break;	/* a fault or an 8-byte tail: below */
		}
	}
	if (n < len)
		n += _copy_from_iter(dst + n, len - n, i);
	return n;
}

/* ktime for the data path's cost counters (sys.rs, counters) */
s64 afx_now_ns(void)
{
	return ktime_get_ns();
}
