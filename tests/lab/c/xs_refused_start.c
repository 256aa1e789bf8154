// SPDX-License-Identifier: GPL-2.0
/*
 * xs_refused_start: has xenstored refuse one XS_TRANSACTION_START that user
 * space sends through /dev/xen/xenbus, then ends every transaction it
 * opened and exits.
 *
 * The domain's connection may hold 10 open transactions (xenstored's
 * quota, shared by the kernel and every process of the guest); this opens
 * up to 20 on one descriptor, so the last ones are refused (ENOSPC). Linux
 * (6.12 and mainline as of 2026-11) then counts the refused request's way
 * out twice (xs_request_exit in drivers/xen/xenbus/xenbus_xs.c checks
 * user_req for TRANSACTION_END but not for a failed TRANSACTION_START), so
 * its count of requests in flight wraps below zero and the guest's next
 * suspend (xl save, xl migrate) waits in xs_suspend for ever.
 *
 * Prints one line per refused start and a summary; exits 0 if at least one
 * start was refused and every opened transaction ended, else 1.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { XS_TRANSACTION_START = 6, XS_TRANSACTION_END = 7, XS_ERROR = 16 };

struct msg {
	uint32_t type, req_id, tx_id, len;
};

static int full_write(int fd, const void *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p = (const char *)p + w;
		n -= (size_t)w;
	}
	return 0;
}

static int full_read(int fd, void *p, size_t n)
{
	while (n) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p = (char *)p + r;
		n -= (size_t)r;
	}
	return 0;
}

/* One request, its reply; the reply's body (NUL-terminated) into body. */
static int call(int fd, uint32_t type, uint32_t req, uint32_t tx,
		const char *payload, uint32_t plen, struct msg *reply, char *body, size_t cap)
{
	struct msg m = { type, req, tx, plen };
	if (full_write(fd, &m, sizeof(m)) || full_write(fd, payload, plen))
		return -1;
	if (full_read(fd, reply, sizeof(*reply)) || reply->len >= cap)
		return -1;
	if (full_read(fd, body, reply->len))
		return -1;
	body[reply->len] = 0;
	return 0;
}

int main(void)
{
	int fd = open("/dev/xen/xenbus", O_RDWR);
	if (fd < 0) {
		perror("/dev/xen/xenbus");
		return 1;
	}
	uint32_t open_tx[20];
	int opened = 0, refused = 0, ended = 0;
	char body[256];
	struct msg r;
	for (uint32_t i = 0; i < 20; i++) {
		if (call(fd, XS_TRANSACTION_START, i, 0, "", 1, &r, body, sizeof(body))) {
			perror("TRANSACTION_START");
			return 1;
		}
		if (r.type == XS_ERROR) {
			printf("xs_refused_start: start %u refused: %s\n", i, body);
			refused++;
		} else {
			unsigned long id = strtoul(body, NULL, 10);
			open_tx[opened++] = (uint32_t)id;
		}
	}
	for (int k = 0; k < opened; k++) {
		if (call(fd, XS_TRANSACTION_END, 100 + k, open_tx[k], "F", 2, &r, body, sizeof(body)) == 0 &&
		    r.type != XS_ERROR)
			ended++;
	}
	close(fd);
	printf("xs_refused_start: %d opened, %d refused, %d ended\n", opened, refused, ended);
	return refused > 0 && ended == opened ? 0 : 1;
}
