/*
 * tf-grpc-bench's link relay: a delayed link between two network namespaces.
 *
 * Built on first use with the system's C compiler (tf_grpc_bench.native) and
 * started by tf_grpc_bench.netns.relay; the Python side documents what it is
 * for.  One relay serves one link in both directions.
 *
 * How it works.  The relay creates a tap device in each namespace (it enters
 * one, then the other, with setns), so the link's ends never appear in the
 * root namespace.  A packet the kernel of side A sends out of its tap is read
 * here, given a release time (the direction's delay from when it was sent, plus
 * a jitter drawn uniformly from [-jitter, +jitter], never before the previous
 * packet's: jitter keeps packet order) and queued; when the time comes it is
 * written to side B's tap, which is B receiving it.  The taps are
 * opened with IFF_VNET_HDR and TUNSETOFFLOAD, so a TCP segmentation-offload
 * packet of up to 64 KiB crosses as one packet, its virtio header passed on
 * unchanged.  The kernel orphans what it hands to a tap, so TCP's small-queue
 * limit does not hold a sender back while its packets wait here.
 *
 * When it was sent.  Beside each tap the relay keeps a packet socket that sees
 * every frame as the kernel hands it to the tap, stamped then (SO_TIMESTAMPNS,
 * cut to its first STAMP_BYTES by a filter); a packet read from the tap is
 * matched with its stamp by those bytes, and its delay counts from the stamp.
 * So the relay's own wake-up for a packet -- tens of microseconds, hundreds
 * after an idle stretch on a virtual machine whose host let the CPU go --
 * is not added to its delay, as long as the relay wakes before the packet is
 * due (a later one is released at once, and counted late).  A packet without
 * a stamp (the socket could not be had, or dropped it) counts from its read;
 * --read-arrival makes every packet do so.  How long stamped packets waited to
 * be read goes into the statistics file.
 *
 * Timing.  Timer slack is 1 ns; the relay sleeps in ppoll until shortly
 * before the next release (or until a packet arrives) and spins the last
 * --spin-ns nanoseconds (a sleeping process wakes tens of microseconds late).
 * After it read or wrote a packet it also spins --busy-poll-ns nanoseconds
 * before it sleeps again, so that a reply that follows soon (a ping-pong's, an
 * acknowledgement) is read at once rather than after a wake-up -- but only while
 * a core is free for it: while the machine's runnable tasks (/proc/loadavg's
 * fourth field, the relay included) are no more than its cores.  A relay that
 * spins at real-time priority on a busy machine takes the core the answering
 * process needs.  An idle link's relay sleeps.  How late each release was (the time the write began minus the
 * release time) goes into a log-linear histogram, per direction, in the
 * statistics file.
 *
 * Compensation.  What the relay itself adds to a packet's way (the copies, the
 * write into the receiving stack, and the wake-up of packets read unstamped) is measured
 * by the tool when the link is set up (netns/calibration.py) and written into
 * the statistics file's compensation_ns; from then on each packet is released
 * that much earlier than its delay says (never before it arrived, never before
 * the packet ahead of it).
 *
 * The queue of each direction is a ring of --queue-bytes bytes; a packet that
 * does not fit is dropped and counted, as a router's full buffer drops it.
 *
 * Statistics file (version 3; read by relay.py, the one parse point).  All
 * fields little-endian.  Header, 256 bytes:
 *   0   char[8]  magic "TFGBRLY1"
 *   8   u32      version (3)          12  u32  directions (2)
 *   16  u64      pid                  24  u64  started_ns (CLOCK_MONOTONIC)
 *   32  u64      sequence: odd while the relay updates the file (a reader
 *                retries until it reads the same even value before and after)
 *   40  u64      stopped: 1 once the relay ended (0 while it runs or if killed)
 *   48  u64      histogram buckets (HISTOGRAM_BUCKETS)
 *   56  u64      compensation_ns: written by the tool, read for every packet
 *   64  u64      cpu_ns: the relay's own CPU time (user and system) so far,
 *                updated every CPU_SAMPLE_NS while it runs and when it stops
 *   72  u64[2]   stamped: per direction, the packets whose send stamp was found
 *   88  u64[2]   read_wait_sum_ns: per direction, how long those waited to be read
 *   104 u64[2]   read_wait_max_ns: and the longest wait
 *   120 u64      reserved
 *   128 char[64] side A ("namespace:interface")   192 char[64] side B
 * then per direction (A to B, then B to A), 12 u64 and the histogram:
 *   delay_ns, jitter_ns, queue_capacity_bytes, packets, bytes, queue_drops,
 *   queue_drop_bytes, write_errors, late_sum_ns, late_max_ns,
 *   queue_peak_bytes, queued_at_stop, histogram[HISTOGRAM_BUCKETS]
 * Histogram bucket b counts lateness v (ns): b = v for v < 32; above, with
 * e = floor(log2 v) and s = the 4 bits below the top one, b = 32 + (e-5)*16 + s.
 *
 * Simulation (fake clock): "relay simulate" runs the same schedule and queue
 * on events read from standard input, one per line:
 *   P <time_ns> <direction 0|1> <bytes>   a packet arrives
 *   T <time_ns>                           the clock moves on to time_ns
 * Releases are due packets written out at the clock's time; it prints
 *   R <direction> <sequence> <arrival_ns> <due_ns> <released_ns> <bytes>
 *   D <direction> <sequence> <arrival_ns> <bytes>      (dropped, queue full)
 * and at the end of the input releases what is queued at its due times.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <linux/filter.h>
#include <linux/if.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define STATS_MAGIC "TFGBRLY1"
#define STATS_VERSION 3
#define HEADER_BYTES 256
#define ENDPOINT_BYTES 64
#define HISTOGRAM_BUCKETS 688
#define DIRECTION_FIELDS 12
/* The largest packet a tap hands over: 64 KiB of GSO payload, headers, virtio header. */
#define MAX_PACKET (65536 + 1024)
#define ENTRY_HEADER 16
#define NO_TIME UINT64_MAX
/* Reads per direction per loop turn, so that releases are never starved. */
#define READ_BURST 64
/* How often the relay writes its own CPU time into the statistics file. */
#define CPU_SAMPLE_NS 10000000u
/* Send stamps: the bytes of a frame kept to match it with the packet read from the tap
 * (enough for Ethernet, IPv6 and a TCP header with options), and how many stamps wait. */
#define STAMP_BYTES 128
#define STAMP_QUEUE 256
#define STAMP_BATCH 64
/* Offsets in the tap's packets: the virtio header comes first. */
#define VNET_HEADER 10

struct direction_stats {
    uint64_t delay_ns, jitter_ns, queue_capacity_bytes, packets, bytes, queue_drops,
        queue_drop_bytes, write_errors, late_sum_ns, late_max_ns, queue_peak_bytes,
        queued_at_stop;
    uint64_t histogram[HISTOGRAM_BUCKETS];
};

struct stats_file {
    char magic[8];
    uint32_t version, directions;
    uint64_t pid, started_ns, sequence, stopped, buckets, compensation_ns, cpu_ns;
    uint64_t stamped[2], read_wait_sum_ns[2], read_wait_max_ns[2], reserved;
    char endpoint[2][ENDPOINT_BYTES];
    struct direction_stats direction[2];
};

_Static_assert(sizeof(struct direction_stats) == (DIRECTION_FIELDS + HISTOGRAM_BUCKETS) * 8,
               "direction layout");
_Static_assert(offsetof(struct stats_file, direction) == HEADER_BYTES, "header layout");

/* One direction's queue: a ring of entries, each a 16-byte header (release
 * time, length) and the packet, padded to 16 bytes.  ``wrap`` is where the
 * data before the tail's jump back to 0 ends (``capacity`` when none). */
struct ring {
    uint8_t *data;
    size_t capacity, head, tail, wrap, count, used;
};

/* The send stamps of a side's frames not read from its tap yet, oldest first: when
 * the sending kernel handed each to the tap (CLOCK_MONOTONIC) and its first bytes. */
struct stamp {
    uint64_t sent_ns;
    uint32_t length;
    uint8_t frame[STAMP_BYTES];
};

struct stamps {
    struct stamp entry[STAMP_QUEUE];
    unsigned head, count;
};

struct direction {
    struct ring ring;
    struct stamps stamps;
    /* A packet socket on the sending side's tap that sees each frame as the kernel
     * hands it over, with its time (-1 without: arrivals are then the reads' times). */
    int stamp_fd;
    uint64_t delay_ns, jitter_ns, last_due, random, sequence;
    struct direction_stats *stats;
    int in_fd, out_fd;
    /* Whether the last ppoll saw in_fd readable: only then is it read (a read that
     * finds nothing is a system call spent on every turn of a spin). */
    int readable;
};

static struct stats_file *stats;
static volatile sig_atomic_t stopping;
/* Whether a packet's arrival is its send stamp (else the time it was read; --read-arrival). */
static int use_stamps = 1;

static void stats_begin(void) { __atomic_add_fetch(&stats->sequence, 1, __ATOMIC_ACQ_REL); }
static void stats_end(void) { __atomic_add_fetch(&stats->sequence, 1, __ATOMIC_RELEASE); }

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

/* ---- the schedule: release times and the jitter's random numbers ---- */

/* The relay's CPU time so far (user and system, ns) into the statistics file. */
static void record_cpu(void) {
    struct timespec t;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t) != 0) return;
    stats_begin();
    stats->cpu_ns = (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
    stats_end();
}

static uint64_t splitmix64(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15u);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* When a packet that arrived at ``arrival`` leaves: delay plus a uniform jitter,
 * less the relay's own cost (the compensation), never before ``arrival`` and never
 * before the previous packet (order kept). */
static uint64_t due_time(struct direction *d, uint64_t arrival) {
    int64_t offset = (int64_t)d->delay_ns -
                     (int64_t)__atomic_load_n(&stats->compensation_ns, __ATOMIC_RELAXED);
    if (d->jitter_ns) {
        uint64_t span = 2 * d->jitter_ns + 1;
        offset += (int64_t)(splitmix64(&d->random) % span) - (int64_t)d->jitter_ns;
    }
    uint64_t due = offset > 0 ? arrival + (uint64_t)offset : arrival;
    if (due < d->last_due) due = d->last_due;
    d->last_due = due;
    return due;
}

static unsigned histogram_bucket(uint64_t value) {
    if (value < 32) return (unsigned)value;
    unsigned top = 63 - (unsigned)__builtin_clzll(value);
    unsigned sub = (unsigned)(value >> (top - 4)) & 15u;
    unsigned bucket = 32 + (top - 5) * 16 + sub;
    return bucket < HISTOGRAM_BUCKETS ? bucket : HISTOGRAM_BUCKETS - 1;
}

/* ---- the bounded queue ---- */

static size_t padded(size_t length) { return (length + 15) & ~(size_t)15; }

/* Room for ``need`` bytes at the tail, contiguous, or NULL if the ring is too full. */
static uint8_t *ring_reserve(struct ring *r, size_t need) {
    if (r->count == 0) r->head = r->tail = 0, r->wrap = r->capacity;
    if (r->tail >= r->head && !(r->count && r->tail == r->head)) {
        if (r->capacity - r->tail >= need) return r->data + r->tail;
        if (need <= r->head) {
            r->wrap = r->tail;
            r->tail = 0;
            return r->data;
        }
        return NULL;
    }
    return r->head - r->tail >= need ? r->data + r->tail : NULL;
}

/* Queue the ``length``-byte packet written at the reserved tail, due at ``due``. */
static void ring_commit(struct ring *r, size_t length, uint64_t due) {
    uint8_t *entry = r->data + r->tail;
    memcpy(entry, &due, 8);
    uint32_t stored = (uint32_t)length;
    memcpy(entry + 8, &stored, 4);
    size_t size = ENTRY_HEADER + padded(length);
    r->tail += size;
    r->count++;
    r->used += size;
}

static int ring_peek(const struct ring *r, uint64_t *due, uint8_t **packet, size_t *length) {
    if (!r->count) return 0;
    const uint8_t *entry = r->data + r->head;
    uint32_t stored;
    memcpy(due, entry, 8);
    memcpy(&stored, entry + 8, 4);
    *packet = (uint8_t *)entry + ENTRY_HEADER;
    *length = stored;
    return 1;
}

static void ring_pop(struct ring *r) {
    uint32_t stored;
    memcpy(&stored, r->data + r->head + 8, 4);
    size_t size = ENTRY_HEADER + padded(stored);
    r->head += size;
    r->used -= size;
    r->count--;
    if (r->head >= r->wrap && r->tail < r->head) r->head = 0, r->wrap = r->capacity;
}

/* Queue a packet that arrived at ``arrival``; 0 if it was dropped (queue full). */
static int enqueue(struct direction *d, uint64_t arrival, const uint8_t *packet, size_t length) {
    uint8_t *slot = ring_reserve(&d->ring, ENTRY_HEADER + padded(length));
    d->sequence++;
    if (!slot) {
        stats_begin();
        d->stats->queue_drops++;
        d->stats->queue_drop_bytes += length;
        stats_end();
        return 0;
    }
    if (packet && packet != slot + ENTRY_HEADER) memcpy(slot + ENTRY_HEADER, packet, length);
    ring_commit(&d->ring, length, due_time(d, arrival));
    if (d->ring.used > d->stats->queue_peak_bytes) {
        stats_begin();
        d->stats->queue_peak_bytes = d->ring.used;
        stats_end();
    }
    return 1;
}

static void count_release(struct direction *d, uint64_t due, uint64_t released, size_t length) {
    uint64_t late = released > due ? released - due : 0;
    stats_begin();
    d->stats->packets++;
    d->stats->bytes += length;
    d->stats->late_sum_ns += late;
    if (late > d->stats->late_max_ns) d->stats->late_max_ns = late;
    d->stats->histogram[histogram_bucket(late)]++;
    stats_end();
}

/* ---- setting up ---- */

static void fail(const char *what) {
    fprintf(stderr, "relay: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void *allocate(size_t bytes) {
    void *memory = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                        -1, 0);
    if (memory == MAP_FAILED) fail("cannot allocate the queue");
    return memory;
}

static void open_stats(const char *path) {
    if (!path) {
        stats = allocate(sizeof *stats);
    } else {
        int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0) fail(path);
        if (ftruncate(fd, sizeof *stats) != 0) fail(path);
        stats = mmap(NULL, sizeof *stats, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (stats == MAP_FAILED) fail(path);
        close(fd);
    }
    memset(stats, 0, sizeof *stats);
    memcpy(stats->magic, STATS_MAGIC, 8);
    stats->version = STATS_VERSION;
    stats->directions = 2;
    stats->pid = (uint64_t)getpid();
    stats->started_ns = now_ns();
    stats->buckets = HISTOGRAM_BUCKETS;
}

/* A tap device named ``name`` in the namespace bound at ``namespace_path``. */
static int open_tap(const char *namespace_path, const char *name, int offload) {
    int ns = open(namespace_path, O_RDONLY | O_CLOEXEC);
    if (ns < 0) fail(namespace_path);
    if (setns(ns, CLONE_NEWNET) != 0) fail("setns");
    close(ns);
    int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) fail("/dev/net/tun");
    struct ifreq request;
    memset(&request, 0, sizeof request);
    request.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
    snprintf(request.ifr_name, IFNAMSIZ, "%s", name);
    if (ioctl(fd, TUNSETIFF, &request) != 0) fail(name);
    int header = 10; /* struct virtio_net_hdr */
    if (ioctl(fd, TUNSETVNETHDRSZ, &header) != 0) fail("TUNSETVNETHDRSZ");
    unsigned long offloads = offload ? TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_TSO_ECN : 0;
    if (ioctl(fd, TUNSETOFFLOAD, offloads) != 0) fail("TUNSETOFFLOAD");
    return fd;
}

/* A packet socket on the tap ``name`` (in the current namespace) that receives the first
 * STAMP_BYTES of each frame its kernel sends out of it, stamped with the time it was
 * handed to the tap (SO_TIMESTAMPNS); -1 if it cannot be had. */
static int open_stamps(const char *name) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
    if (fd < 0) return -1;
    /* Outgoing frames only, cut to STAMP_BYTES; nothing else is queued. */
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, (uint32_t)(SKF_AD_OFF + SKF_AD_PKTTYPE)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, PACKET_OUTGOING, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, STAMP_BYTES),
        BPF_STMT(BPF_RET | BPF_K, 0),
    };
    struct sock_fprog program = {.len = sizeof code / sizeof code[0], .filter = code};
    int on = 1, buffer = 4 << 20;
    struct ifreq request;
    memset(&request, 0, sizeof request);
    snprintf(request.ifr_name, IFNAMSIZ, "%s", name);
    struct sockaddr_ll address = {.sll_family = AF_PACKET, .sll_protocol = htons(ETH_P_ALL)};
    if (setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &program, sizeof program) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &on, sizeof on) != 0 ||
        ioctl(fd, SIOCGIFINDEX, &request) != 0 ||
        (address.sll_ifindex = request.ifr_ifindex,
         bind(fd, (struct sockaddr *)&address, sizeof address) != 0)) {
        close(fd);
        return -1;
    }
    /* Room for the stamps of a burst of offload packets (each counts its whole size). */
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
    return fd;
}

/* "DELAY_NS:JITTER_NS" */
static void parse_timing(const char *text, struct direction *d) {
    char *end;
    d->delay_ns = strtoull(text, &end, 10);
    if (*end != ':') {
        fprintf(stderr, "relay: bad timing %s: expected DELAY_NS:JITTER_NS\n", text);
        exit(2);
    }
    d->jitter_ns = strtoull(end + 1, &end, 10);
    if (*end) {
        fprintf(stderr, "relay: bad timing %s: expected DELAY_NS:JITTER_NS\n", text);
        exit(2);
    }
}

struct options {
    const char *side[2], *stats_path, *timing[2];
    uint64_t seed, queue_bytes, spin_ns, busy_poll_ns, compensation_ns;
    int offload, priority, read_arrival;
};

static void usage(void) {
    fprintf(stderr,
            "usage: relay run --a NSPATH:IFNAME --b NSPATH:IFNAME [--ab D:J] [--ba D:J] [--seed N]\n"
            "             [--queue-bytes N] [--spin-ns N] [--busy-poll-ns N] [--no-offload]\n"
            "             [--priority N] [--compensation-ns N] [--read-arrival] [--stats FILE]\n"
            "       relay simulate [--ab D:J] [--ba D:J] [--seed N] [--queue-bytes N]\n"
            "             [--compensation-ns N] [--stats FILE]\n");
    exit(2);
}

static void parse_options(int argc, char **argv, struct options *o) {
    memset(o, 0, sizeof *o);
    o->timing[0] = o->timing[1] = "0:0";
    o->queue_bytes = 64u << 20;
    o->spin_ns = 50000;
    o->offload = 1;
    for (int i = 2; i < argc; i++) {
        const char *flag = argv[i];
        if (!strcmp(flag, "--no-offload")) { o->offload = 0; continue; }
        if (!strcmp(flag, "--read-arrival")) { o->read_arrival = 1; continue; }
        if (i + 1 >= argc) usage();
        const char *value = argv[++i];
        if (!strcmp(flag, "--a")) o->side[0] = value;
        else if (!strcmp(flag, "--b")) o->side[1] = value;
        else if (!strcmp(flag, "--ab")) o->timing[0] = value;
        else if (!strcmp(flag, "--ba")) o->timing[1] = value;
        else if (!strcmp(flag, "--seed")) o->seed = strtoull(value, NULL, 10);
        else if (!strcmp(flag, "--queue-bytes")) o->queue_bytes = strtoull(value, NULL, 10);
        else if (!strcmp(flag, "--spin-ns")) o->spin_ns = strtoull(value, NULL, 10);
        else if (!strcmp(flag, "--busy-poll-ns")) o->busy_poll_ns = strtoull(value, NULL, 10);
        else if (!strcmp(flag, "--compensation-ns")) o->compensation_ns = strtoull(value, NULL, 10);
        else if (!strcmp(flag, "--priority")) o->priority = atoi(value);
        else if (!strcmp(flag, "--stats")) o->stats_path = value;
        else usage();
    }
    if (o->queue_bytes < 2 * (ENTRY_HEADER + MAX_PACKET)) o->queue_bytes = 2 * (ENTRY_HEADER + MAX_PACKET);
}

static void set_up_directions(const struct options *o, struct direction d[2]) {
    stats->compensation_ns = o->compensation_ns;
    for (int i = 0; i < 2; i++) {
        memset(&d[i], 0, sizeof d[i]);
        d[i].stamp_fd = -1;
        parse_timing(o->timing[i], &d[i]);
        d[i].ring.capacity = padded(o->queue_bytes);
        d[i].ring.data = allocate(d[i].ring.capacity);
        d[i].ring.wrap = d[i].ring.capacity;
        d[i].random = o->seed * 2 + (uint64_t)i + 1;
        d[i].stats = &stats->direction[i];
        d[i].stats->delay_ns = d[i].delay_ns;
        d[i].stats->jitter_ns = d[i].jitter_ns;
        d[i].stats->queue_capacity_bytes = d[i].ring.capacity;
    }
}

static void finish(struct direction d[2]) {
    record_cpu();
    stats_begin();
    for (int i = 0; i < 2; i++) d[i].stats->queued_at_stop = d[i].ring.count;
    stats->stopped = 1;
    stats_end();
}

/* ---- simulation: the same schedule and queue, on a clock read from stdin ---- */

static void simulate_release(struct direction *d, int index, uint64_t clock, int flush) {
    uint64_t due;
    uint8_t *packet;
    size_t length;
    while (ring_peek(&d->ring, &due, &packet, &length) && (flush || due <= clock)) {
        uint64_t released = flush && due > clock ? due : clock;
        uint64_t arrival;
        memcpy(&arrival, packet, 8);
        uint64_t sequence;
        memcpy(&sequence, packet + 8, 8);
        printf("R %d %llu %llu %llu %llu %zu\n", index, (unsigned long long)sequence,
               (unsigned long long)arrival, (unsigned long long)due, (unsigned long long)released,
               length);
        count_release(d, due, released, length);
        ring_pop(&d->ring);
    }
}

static int simulate(const struct options *o) {
    struct direction d[2];
    set_up_directions(o, d);
    static uint8_t packet[MAX_PACKET];
    char line[256];
    uint64_t clock = 0;
    while (fgets(line, sizeof line, stdin)) {
        unsigned long long time, bytes;
        int index;
        if (sscanf(line, "P %llu %d %llu", &time, &index, &bytes) == 3) {
            if (index < 0 || index > 1 || bytes < 16 || bytes > MAX_PACKET || time < clock) {
                fprintf(stderr, "relay: bad event: %s", line);
                return 2;
            }
            clock = time;
            simulate_release(&d[0], 0, clock, 0);
            simulate_release(&d[1], 1, clock, 0);
            /* The packet carries its arrival time and sequence, to be printed on release. */
            uint64_t sequence = d[index].sequence;
            memcpy(packet, &clock, 8);
            memcpy(packet + 8, &sequence, 8);
            if (!enqueue(&d[index], clock, packet, bytes))
                printf("D %d %llu %llu %llu\n", index, (unsigned long long)sequence, time, bytes);
        } else if (sscanf(line, "T %llu", &time) == 1 && time >= clock) {
            clock = time;
            simulate_release(&d[0], 0, clock, 0);
            simulate_release(&d[1], 1, clock, 0);
        } else {
            fprintf(stderr, "relay: bad event: %s", line);
            return 2;
        }
    }
    simulate_release(&d[0], 0, clock, 1);
    simulate_release(&d[1], 1, clock, 1);
    finish(d);
    return 0;
}

/* ---- the relay ---- */

static void on_stop(int signum) {
    (void)signum;
    stopping = 1;
}

/* Queue the send stamps waiting on ``d->stamp_fd``, STAMP_BATCH per system call (the
 * oldest go if the queue is full). */
static void collect_stamps(struct direction *d) {
    static struct stamp batch[STAMP_BATCH];
    static struct mmsghdr messages[STAMP_BATCH];
    static struct iovec data[STAMP_BATCH];
    static union {
        char buffer[CMSG_SPACE(sizeof(struct timespec))];
        struct cmsghdr align;
    } control[STAMP_BATCH];
    struct stamps *q = &d->stamps;
    for (;;) {
        for (int i = 0; i < STAMP_BATCH; i++) {
            data[i] = (struct iovec){.iov_base = batch[i].frame, .iov_len = STAMP_BYTES};
            messages[i].msg_hdr = (struct msghdr){.msg_iov = &data[i], .msg_iovlen = 1,
                                                  .msg_control = control[i].buffer,
                                                  .msg_controllen = sizeof control[i]};
        }
        int got = recvmmsg(d->stamp_fd, messages, STAMP_BATCH, MSG_DONTWAIT, NULL);
        if (got <= 0) return;
        /* CLOCK_REALTIME to the relay's CLOCK_MONOTONIC: their offset now. */
        struct timespec real;
        clock_gettime(CLOCK_REALTIME, &real);
        uint64_t now = now_ns();
        for (int i = 0; i < got; i++) {
            struct cmsghdr *c = CMSG_FIRSTHDR(&messages[i].msg_hdr);
            if (!c || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_TIMESTAMPNS) continue;
            struct timespec sent;
            memcpy(&sent, CMSG_DATA(c), sizeof sent);
            int64_t ago = ((int64_t)real.tv_sec - sent.tv_sec) * 1000000000 +
                          (real.tv_nsec - sent.tv_nsec);
            struct stamp *s = &q->entry[(q->head + q->count) % STAMP_QUEUE];
            s->sent_ns = ago <= 0 ? now : now - (uint64_t)ago;
            s->length = messages[i].msg_len;
            memcpy(s->frame, batch[i].frame, s->length);
            if (q->count < STAMP_QUEUE) q->count++;
            else q->head = (q->head + 1) % STAMP_QUEUE;
        }
        if (got < STAMP_BATCH) return;
    }
}

/* The stamp of the frame ``packet`` (as read from the tap), and those before it, taken
 * off the queue: its send time, or 0 if none matches. */
static uint64_t take_stamp(struct stamps *q, const uint8_t *packet, size_t length) {
    if (length <= VNET_HEADER) return 0;
    const uint8_t *frame = packet + VNET_HEADER;
    size_t frame_length = length - VNET_HEADER;
    for (unsigned i = 0; i < q->count; i++) {
        const struct stamp *s = &q->entry[(q->head + i) % STAMP_QUEUE];
        size_t compared = frame_length < s->length ? frame_length : s->length;
        if (compared && !memcmp(s->frame, frame, compared)) {
            q->head = (q->head + i + 1) % STAMP_QUEUE;
            q->count -= i + 1;
            return s->sent_ns;
        }
    }
    return 0;
}

/* When the packet read at ``read_ns`` arrived: when its kernel sent it, if its stamp is
 * found (a stamp after the read, or a second or more before it, is a clock's step: the
 * read's time then); else the read's time.  The time between is counted. */
static uint64_t arrival_time(struct direction *d, int index, const uint8_t *packet, size_t length,
                             uint64_t read_ns) {
    if (d->stamp_fd < 0) return read_ns;
    uint64_t sent = take_stamp(&d->stamps, packet, length);
    if (!sent) {
        collect_stamps(d);
        sent = take_stamp(&d->stamps, packet, length);
    }
    if (!sent || sent > read_ns || read_ns - sent >= 1000000000u) return read_ns;
    uint64_t wait = read_ns - sent;
    stats_begin();
    stats->stamped[index]++;
    stats->read_wait_sum_ns[index] += wait;
    if (wait > stats->read_wait_max_ns[index]) stats->read_wait_max_ns[index] = wait;
    stats_end();
    return use_stamps ? sent : read_ns;
}

/* Read what side ``d->in_fd`` sent: the number of packets, -1 if its device is gone. */
static int drain(struct direction *d, int index, uint8_t *scratch) {
    int n;
    for (n = 0; n < READ_BURST; n++) {
        uint8_t *slot = ring_reserve(&d->ring, ENTRY_HEADER + MAX_PACKET);
        uint8_t *target = slot ? slot + ENTRY_HEADER : scratch;
        ssize_t got = read(d->in_fd, target, MAX_PACKET);
        uint64_t read_ns = now_ns();
        if (got < 0) {
            if (errno == EAGAIN || errno == EINTR) return n;
            return -1;
        }
        if (got == 0) return n;
        enqueue(d, arrival_time(d, index, target, (size_t)got, read_ns), target, (size_t)got);
    }
    return n;
}

/* Write the packets that are due: the number written. */
static int release(struct direction *d) {
    uint64_t due;
    uint8_t *packet;
    size_t length;
    int n = 0;
    while (ring_peek(&d->ring, &due, &packet, &length)) {
        uint64_t now = now_ns();
        if (due > now) return n;
        if (write(d->out_fd, packet, length) < 0) {
            stats_begin();
            d->stats->write_errors++;
            stats_end();
        }
        count_release(d, due, now, length);
        ring_pop(&d->ring);
        n++;
    }
    return n;
}

static uint64_t next_due(struct direction d[2]) {
    uint64_t best = NO_TIME, due;
    uint8_t *packet;
    size_t length;
    for (int i = 0; i < 2; i++)
        if (ring_peek(&d[i].ring, &due, &packet, &length) && due < best) best = due;
    return best;
}

/* Whether a core is free for the relay to spin on: the machine's runnable tasks,
 * the relay included, no more than its cores (/proc/loadavg, kept open). */
static int core_free(void) {
    static int fd = -2;
    static long cores;
    if (fd == -2) {
        fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
        cores = sysconf(_SC_NPROCESSORS_ONLN);
    }
    char text[128];
    ssize_t got = fd < 0 ? -1 : pread(fd, text, sizeof text - 1, 0);
    if (got <= 0) return 0;
    text[got] = 0;
    char *field = text;
    for (int i = 0; i < 3 && field; i++) field = strchr(field + 1, ' ');
    return field && strtol(field + 1, NULL, 10) <= cores;
}

/* Wait for the next release or arrival.  Spins (a zero-timeout ppoll, which only
 * lets a pending stop signal in) when a release is due within ``spin_ns``, or
 * within ``busy_poll_ns`` of the last packet read or written while a core is free:
 * a sleeping process wakes tens of microseconds late. */
static int wait_for(struct direction d[2], const struct options *o, const sigset_t *unblocked,
                    uint64_t last_packet) {
    uint64_t due = next_due(d), now = now_ns();
    struct pollfd fds[2] = {{.fd = d[0].in_fd, .events = POLLIN}, {.fd = d[1].in_fd, .events = POLLIN}};
    struct timespec timeout = {0, 0}, *limit = NULL;
    if ((due != NO_TIME && due <= now + o->spin_ns) ||
        (now < last_packet + o->busy_poll_ns && core_free())) {
        /* Spinning: a zero timeout only lets a pending stop signal in. */
        limit = &timeout;
    } else if (due != NO_TIME) {
        uint64_t sleep = due - now - o->spin_ns;
        timeout.tv_sec = (time_t)(sleep / 1000000000u);
        timeout.tv_nsec = (long)(sleep % 1000000000u);
        limit = &timeout;
    }
    int ready = ppoll(fds, 2, limit, unblocked);
    if (ready < 0 && errno != EINTR) return -1;
    for (int i = 0; i < 2; i++) {
        if (fds[i].revents & (POLLERR | POLLHUP | POLLNVAL)) return -1;
        d[i].readable = ready < 0 || (fds[i].revents & POLLIN);
    }
    return 0;
}

static int relay(const struct options *o) {
    char path[2][256], name[2][IFNAMSIZ];
    for (int i = 0; i < 2; i++) {
        const char *colon = o->side[i] ? strrchr(o->side[i], ':') : NULL;
        if (!colon || colon == o->side[i] || strlen(colon + 1) >= IFNAMSIZ ||
            (size_t)(colon - o->side[i]) >= sizeof path[i])
            usage();
        snprintf(path[i], sizeof path[i], "%.*s", (int)(colon - o->side[i]), o->side[i]);
        snprintf(name[i], sizeof name[i], "%s", colon + 1);
    }
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    if (o->priority > 0) {
        struct sched_param parameter = {.sched_priority = o->priority};
        if (sched_setscheduler(0, SCHED_FIFO, &parameter) != 0)
            fprintf(stderr, "relay: no real-time priority (%s); releases may be later\n", strerror(errno));
    }
    struct direction d[2];
    set_up_directions(o, d);
    for (int i = 0; i < 2; i++) snprintf(stats->endpoint[i], ENDPOINT_BYTES, "%s", o->side[i]);
    /* Each side's stamp socket is opened in its namespace, right after its tap. */
    int tap[2], stamp[2];
    for (int i = 0; i < 2; i++) {
        tap[i] = open_tap(path[i], name[i], o->offload);
        stamp[i] = open_stamps(name[i]);
        if (stamp[i] < 0)
            fprintf(stderr, "relay: no send stamps on %s (%s); arrivals are read times\n", name[i],
                    strerror(errno));
    }
    d[0].in_fd = tap[0], d[0].out_fd = tap[1], d[0].stamp_fd = stamp[0];
    d[1].in_fd = tap[1], d[1].out_fd = tap[0], d[1].stamp_fd = stamp[1];
    use_stamps = !o->read_arrival;
    sigset_t stop, unblocked;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM), sigaddset(&stop, SIGINT), sigaddset(&stop, SIGHUP);
    sigprocmask(SIG_BLOCK, &stop, &unblocked);
    struct sigaction action = {.sa_handler = on_stop};
    for (int s = 0; s < 3; s++) sigaction((int[]){SIGTERM, SIGINT, SIGHUP}[s], &action, NULL);
    static uint8_t scratch[MAX_PACKET];
    printf("ready %d\n", getpid());
    fflush(stdout);
    int status = 0;
    uint64_t last_packet = 0, cpu_sampled = 0;
    d[0].readable = d[1].readable = 1;
    while (!stopping) {
        int moved = release(&d[0]) + release(&d[1]);
        int read_a = d[0].readable ? drain(&d[0], 0, scratch) : 0;
        int read_b = read_a < 0 || !d[1].readable ? 0 : drain(&d[1], 1, scratch);
        if (moved + read_a + read_b > 0) last_packet = now_ns();
        if (last_packet >= cpu_sampled + CPU_SAMPLE_NS) {
            record_cpu();
            cpu_sampled = last_packet;
        }
        if (read_a < 0 || read_b < 0 || wait_for(d, o, &unblocked, last_packet) < 0) {
            fprintf(stderr, "relay: a tap device is gone (its namespace was deleted); stopping\n");
            status = 3;
            break;
        }
    }
    finish(d);
    return status;
}

int main(int argc, char **argv) {
    if (argc < 2) usage();
    struct options o;
    parse_options(argc, argv, &o);
    open_stats(o.stats_path);
    if (!strcmp(argv[1], "simulate")) return simulate(&o);
    if (!strcmp(argv[1], "run")) return relay(&o);
    usage();
    return 2;
}
