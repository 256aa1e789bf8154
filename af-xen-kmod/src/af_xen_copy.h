/* SPDX-License-Identifier: GPL-2.0 */
/* af_xen.ko ring copy routines (af_xen_copy.c; declared again in src/sys.rs). */
#define AFX_COPY_ITER 0
#define AFX_COPY_NOCACHE 1
#define AFX_COPY_LOOP 2
struct iov_iter;
unsigned int afx_copy_mode_default(void);
size_t afx_copy_to_iter(unsigned int mode, const void *src, size_t len, struct iov_iter *i);
size_t afx_copy_from_iter(unsigned int mode, void *dst, size_t len, struct iov_iter *i);
s64 afx_now_ns(void);
