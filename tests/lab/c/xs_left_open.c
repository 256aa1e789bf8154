// SPDX-License-Identifier: GPL-2.0
/*
 * xs_left_open: starts one XS_TRANSACTION_START through /dev/xen/xenbus
 * and closes the descriptor without ending it, as a process does that
 * exits (or is killed) in the middle of a transaction.
 *
 * The kernel then ends the transaction itself when it frees the file
 * (xenbus_worker in drivers/xen/xenbus/xenbus_dev_frontend.c) with its own
 * xenbus_transaction_end(), a kernel request. Linux (6.12 and mainline as
 * of 2026-11) counts a kernel TRANSACTION_END's way out twice in
 * xs_state_users (xs_request_exit in xenbus_xs.c: one for the request,
 * one for the open transaction a kernel TRANSACTION_START counted), but a
 * user-space start counted no open transaction, so the count wraps below
 * zero and the guest's next suspend (xl save, xl migrate) waits in
 * xs_suspend for ever.
 *
 * Prints the transaction it left open; exits 0 if the start succeeded.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

enum { XS_TRANSACTION_START = 6, XS_ERROR = 16 };

struct msg {
	uint32_t type, req_id, tx_id, len;
};

static int full_io(int fd, void *p, size_t n, int writing)
{
	while (n) {
		ssize_t k = writing ? write(fd, p, n) : read(fd, p, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return -1;
		p = (char *)p + k;
		n -= (size_t)k;
	}
	return 0;
}

int main(void)
{
	int fd = open("/dev/xen/xenbus", O_RDWR);
	struct msg m = { XS_TRANSACTION_START, 1, 0, 1 };
	char body[64];

	if (fd < 0) {
		perror("/dev/xen/xenbus");
		return 1;
	}
	if (full_io(fd, &m, sizeof(m), 1) || full_io(fd, "", 1, 1) || full_io(fd, &m, sizeof(m), 0) ||
	    m.len >= sizeof(body) || full_io(fd, body, m.len, 0)) {
		perror("TRANSACTION_START");
		return 1;
	}
	body[m.len] = 0;
	if (m.type == XS_ERROR) {
		printf("xs_left_open: start refused: %s\n", body);
		return 1;
	}
	printf("xs_left_open: transaction %s left open at close\n", body);
	close(fd);
	return 0;
}
