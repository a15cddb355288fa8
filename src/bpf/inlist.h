// SPDX-License-Identifier: GPL-2.0-only OR BSD-2-Clause
/* Whether `v` is among the first `n` (at most `max`) items of a read-only
 * filter list set by user space. Bounded for the verifier. */
#ifndef SONDE_INLIST_H
#define SONDE_INLIST_H

#define IN_LIST(list, n, max, v)                                                                   \
	({                                                                                         \
		bool _hit = false;                                                                 \
		for (__u32 _i = 0; _i < (max) && _i < (n); _i++)                                   \
			if ((list)[_i] == (v))                                                     \
				_hit = true;                                                       \
		_hit;                                                                              \
	})

#endif
