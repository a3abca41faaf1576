/*
 * The C side of fibre-bench's DPDK peer: DPDK's environment (EAL) started once, without
 * hugepages or devices, and DPDK's FIBs (rte_fib DIR-24-8 for IPv4, rte_fib6 trie for
 * IPv6) made, filled and freed. Lookups do not come through here: the Rust side calls
 * rte_fib_lookup_bulk and rte_fib6_lookup_bulk itself, as an application would.
 *
 * Built by crates/bench/build.rs only where pkg-config finds libdpdk.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_fib.h>
#include <rte_fib6.h>
#include <rte_lcore.h>
#include <rte_log.h>
#include <rte_malloc.h>
#include <rte_vect.h>

/* DPDK's log, kept in memory so that a failure can say what DPDK said. */
static char *log_text;
static size_t log_len;
static FILE *log_stream;

/* Copies the last non-empty line of DPDK's log into `out`. */
static void last_log_line(char *out, size_t len)
{
	out[0] = '\0';
	if (log_stream == NULL || len == 0)
		return;
	fflush(log_stream);
	if (log_text == NULL || log_len == 0)
		return;
	size_t end = log_len;
	while (end > 0 && (log_text[end - 1] == '\n' || log_text[end - 1] == ' '))
		end--;
	size_t start = end;
	while (start > 0 && log_text[start - 1] != '\n')
		start--;
	size_t n = end - start < len - 1 ? end - start : len - 1;
	memcpy(out, log_text + start, n);
	out[n] = '\0';
}

/*
 * Starts DPDK's environment with `mem_mb` MiB of ordinary memory (no hugepages), no PCI
 * devices, nothing shared with other processes (no shared configuration), on the first CPU this thread may run on,
 * and vector lookups up to 512 bits allowed. The calling thread's CPU affinity, which
 * rte_eal_init pins to that CPU, is restored afterwards. Returns 0, or -1 with the
 * reason in `why`.
 */
int fibre_dpdk_init(unsigned int mem_mb, char *why, size_t why_len)
{
	cpu_set_t before;
	int cpu = -1;
	char mem[32], lcore[32], prefix[64];

	if (pthread_getaffinity_np(pthread_self(), sizeof(before), &before) != 0) {
		snprintf(why, why_len, "cannot read the thread's CPU affinity");
		return -1;
	}
	for (int i = 0; i < CPU_SETSIZE; i++) {
		if (CPU_ISSET(i, &before)) {
			cpu = i;
			break;
		}
	}
	if (cpu < 0 || cpu >= RTE_MAX_LCORE) {
		snprintf(why, why_len, "no CPU for DPDK's main lcore");
		return -1;
	}
	log_stream = open_memstream(&log_text, &log_len);
	if (log_stream != NULL)
		rte_openlog_stream(log_stream);
	snprintf(mem, sizeof(mem), "%u", mem_mb);
	snprintf(lcore, sizeof(lcore), "%d", cpu);
	snprintf(prefix, sizeof(prefix), "--file-prefix=fibre-bench-%d", (int)getpid());
	char *argv[] = {
		"fibre-bench", "--no-huge", "-m", mem, "-l", lcore, "--no-pci",
		"--no-shconf", "--no-telemetry", prefix, "--log-level=5",
		"--force-max-simd-bitwidth=512", NULL,
	};
	int argc = (int)(sizeof(argv) / sizeof(argv[0])) - 1;
	int ret = rte_eal_init(argc, argv);
	int err = rte_errno;
	pthread_setaffinity_np(pthread_self(), sizeof(before), &before);
	/* Nothing is shared (--no-shconf): the runtime folder EAL made stays empty. */
	rmdir(rte_eal_get_runtime_dir());
	if (ret < 0) {
		char line[200];
		last_log_line(line, sizeof(line));
		snprintf(why, why_len, "rte_eal_init failed: %s%s%s", strerror(err),
			 line[0] ? "; DPDK said: " : "", line);
		return -1;
	}
	return 0;
}

/* Bytes allocated from DPDK's heaps, every socket. */
unsigned long long fibre_dpdk_heap_bytes(void)
{
	unsigned long long sum = 0;
	unsigned int sockets = rte_socket_count();
	for (unsigned int i = 0; i < sockets; i++) {
		struct rte_malloc_socket_stats s;
		if (rte_malloc_get_socket_stats(rte_socket_id_by_idx(i), &s) == 0)
			sum += s.heap_allocsz_bytes;
	}
	return sum;
}

/* The reason of the last failure: errno `err`, and DPDK's last log line. */
static void failure(const char *what, int err, char *why, size_t why_len)
{
	char line[200];
	last_log_line(line, sizeof(line));
	snprintf(why, why_len, "%s failed: %s%s%s", what, strerror(err),
		 line[0] ? "; DPDK said: " : "", line);
}

/*
 * A DIR-24-8 FIB with 4-byte next hops, room for `max_routes` routes and `num_tbl8`
 * second-level groups, answering `default_nh` where no route matches; its lookups the
 * AVX-512 ones where this CPU has them (`*vector` = 1), the scalar ones otherwise.
 * NULL with the reason in `why` on failure.
 */
struct rte_fib *fibre_dpdk_fib4_create(const char *name, int max_routes, unsigned int num_tbl8,
				       unsigned long long default_nh, int *vector, char *why,
				       size_t why_len)
{
	struct rte_fib_conf conf;
	memset(&conf, 0, sizeof(conf));
	conf.type = RTE_FIB_DIR24_8;
	conf.default_nh = default_nh;
	conf.max_routes = max_routes;
	conf.rib_ext_sz = 0;
	conf.dir24_8.nh_sz = RTE_FIB_DIR24_8_4B;
	conf.dir24_8.num_tbl8 = num_tbl8;
	struct rte_fib *fib = rte_fib_create(name, SOCKET_ID_ANY, &conf);
	if (fib == NULL) {
		failure("rte_fib_create", rte_errno, why, why_len);
		return NULL;
	}
	*vector = rte_fib_select_lookup(fib, RTE_FIB_LOOKUP_DIR24_8_VECTOR_AVX512) == 0;
	if (!*vector && rte_fib_select_lookup(fib, RTE_FIB_LOOKUP_DEFAULT) != 0) {
		snprintf(why, why_len, "rte_fib_select_lookup found no lookup function");
		rte_fib_free(fib);
		return NULL;
	}
	return fib;
}

/* Adds a route; 0, or a negative errno (-ENOSPC: out of tbl8 groups). */
int fibre_dpdk_fib4_add(struct rte_fib *fib, unsigned int ip, unsigned char depth,
			unsigned long long nh)
{
	return rte_fib_add(fib, ip, depth, nh);
}

void fibre_dpdk_fib4_free(struct rte_fib *fib)
{
	rte_fib_free(fib);
}

/* As fibre_dpdk_fib4_create, for IPv6: a trie with 4-byte next hops. */
struct rte_fib6 *fibre_dpdk_fib6_create(const char *name, int max_routes, unsigned int num_tbl8,
					unsigned long long default_nh, int *vector, char *why,
					size_t why_len)
{
	struct rte_fib6_conf conf;
	memset(&conf, 0, sizeof(conf));
	conf.type = RTE_FIB6_TRIE;
	conf.default_nh = default_nh;
	conf.max_routes = max_routes;
	conf.rib_ext_sz = 0;
	conf.trie.nh_sz = RTE_FIB6_TRIE_4B;
	conf.trie.num_tbl8 = num_tbl8;
	struct rte_fib6 *fib = rte_fib6_create(name, SOCKET_ID_ANY, &conf);
	if (fib == NULL) {
		failure("rte_fib6_create", rte_errno, why, why_len);
		return NULL;
	}
	*vector = rte_fib6_select_lookup(fib, RTE_FIB6_LOOKUP_TRIE_VECTOR_AVX512) == 0;
	if (!*vector && rte_fib6_select_lookup(fib, RTE_FIB6_LOOKUP_DEFAULT) != 0) {
		snprintf(why, why_len, "rte_fib6_select_lookup found no lookup function");
		rte_fib6_free(fib);
		return NULL;
	}
	return fib;
}

/* Adds a route (the address in network order); 0, or a negative errno. */
int fibre_dpdk_fib6_add(struct rte_fib6 *fib, const unsigned char ip[16], unsigned char depth,
			unsigned long long nh)
{
	return rte_fib6_add(fib, ip, depth, nh);
}

void fibre_dpdk_fib6_free(struct rte_fib6 *fib)
{
	rte_fib6_free(fib);
}
