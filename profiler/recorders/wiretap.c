/*
 * In-process recorder of gRPC traffic: an LD_PRELOAD library for the tasks
 * of a training job (profiler/recorders/wiretap.py builds it; tapfile.py reads
 * its records).
 *
 * Every process of the job sends its own bytes, so recording what each
 * process sends on its cluster connections records every byte between tasks
 * once, without a second TCP hop.  The library wraps the send calls
 * (sendmsg, send, sendto, write, writev) and close/dup2/dup3; a socket is
 * followed when it is a TCP connection whose local or peer port is one of
 * $TFGB_WIRETAP_PORTS (the tasks' listening ports).
 *
 * After the real call returns, the bytes it sent are walked with just enough
 * of HTTP/2 and gRPC framing to know which of them a trace needs: frame
 * headers, non-DATA payloads, DATA pad lengths, 5-byte gRPC message prefixes
 * and the first $TFGB_WIRETAP_HEAD bytes of each message are kept ("feed");
 * the rest of each message, the bulk of a tensor, is only counted ("skip").
 * This is exactly what profiler/recorders/http2.py's Http2Follower reports as
 * skippable, so the reader replays the records through that follower, which
 * does all of the actual parsing.  Nothing is parsed or decoded here.
 *
 * Records go to $TFGB_WIRETAP_DIR/tap-<pid>.bin, a sparse file of
 * $TFGB_WIRETAP_BYTES bytes mapped shared: a record is memcpy'd into the
 * mapping, so it survives the process being killed, and no system call is
 * made per send.  Layout (little-endian, every record 8-byte aligned):
 *
 *   file header, 64 B: "TFGBTAP1", u32 version, u32 pid, u32 ppid,
 *     u32 head_bytes, u64 capacity, u64 next (end of reserved records),
 *     u64 dropped (records that did not fit), u64 created_ns
 *   record: u32 length (whole record, stored last: 0 means not written),
 *     u16 type, u16 zero, u32 connection, u32 took_ns, u64 time_ns, payload
 *     (took_ns, version 2: how long the send call took, saturated at
 *     2^32 - 1; 0 in version 1 files and in records other than SENT)
 *   CONNECTION (1): u16 family, u16 side (0 client, 1 server),
 *     u16 local port, u16 peer port, u8[16] local address,
 *     u8[16] peer address, i32 fd, u32 zero
 *   SENT (2): operations, each a u32: bit 31 set = skip (low 31 bits:
 *     count); clear = feed that many bytes, which follow, padded to 4 B
 *   CLOSED (3): no payload
 *   LOST (4): no payload; the library could not record this connection's
 *     later sends (out of memory): its records end here
 *
 * Times are CLOCK_MONOTONIC ns, taken when the send call returned; a SENT
 * record's send call began took_ns earlier (what a peer on another clock may
 * have answered before the call returned).
 * Thread-safety: records are reserved with an atomic add on "next"; one
 * connection's framing state is guarded by its own mutex.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define TAP_VERSION 2
#define HEADER_BYTES 64
#define MAX_FDS 65536
#define DEFAULT_CAPACITY (1ULL << 30)
#define DEFAULT_HEAD 1024
#define PREFACE_BYTES 24
#define FRAME_HEADER_BYTES 9
#define GRPC_PREFIX_BYTES 5

#define RECORD_CONNECTION 1
#define RECORD_SENT 2
#define RECORD_CLOSED 3
#define RECORD_LOST 4
#define SKIP_BIT 0x80000000u
#define MAX_OP 0x7fffffffu

/* Framing states: what the next bytes of the direction are. */
enum { S_PREFACE, S_FRAME_HEADER, S_FRAME_BODY, S_DATA_PAD_LENGTH, S_DATA, S_DATA_PADDING };

#define TYPE_DATA 0
#define TYPE_HEADERS 1
#define TYPE_RST_STREAM 3
#define FLAG_END_STREAM 0x1
#define FLAG_PADDED 0x8

struct stream {
    uint32_t id;
    uint8_t in_message;
    uint8_t prefix_len;
    uint32_t remaining;
    uint32_t head_left;
};

struct connection {
    pthread_mutex_t lock;
    uint32_t number;
    int state;
    uint32_t left;        /* bytes left in the current piece */
    uint8_t header[FRAME_HEADER_BYTES];
    uint32_t header_len;
    uint32_t stream_id;   /* of the current DATA frame */
    int end_stream;
    uint32_t padding;
    struct stream *streams;
    uint32_t stream_count, stream_capacity;
    struct stream *current;
    /* The SENT record being built for one send call. */
    uint8_t *scratch;
    size_t scratch_len, scratch_capacity;
    size_t feed_at;       /* 1 + offset of the last op if it feeds, else 0 */
    size_t skip_at;       /* 1 + offset of the last op if it skips, else 0 */
    uint8_t announce[48]; /* the CONNECTION record's payload */
    int broken;           /* out of memory once: nothing more is recorded */
};

static ssize_t (*real_sendmsg)(int, const struct msghdr *, int);
static ssize_t (*real_send)(int, const void *, size_t, int);
static ssize_t (*real_sendto)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
static ssize_t (*real_write)(int, const void *, size_t);
static ssize_t (*real_writev)(int, const struct iovec *, int);
static int (*real_close)(int);
static int (*real_dup2)(int, int);
static int (*real_dup3)(int, int, int);

/* The wrapped call, found on first use: another library's constructor may make one before
   set_up runs (libgrpc's, probing for eventfd, closes a descriptor as it loads). */
#define REAL(name) (real_##name ? real_##name : (real_##name = dlsym(RTLD_NEXT, #name)))

/* Per fd: NULL = not looked at yet, IGNORED = not ours, else the connection. */
#define IGNORED ((struct connection *)1)
static struct connection *volatile fds[MAX_FDS];
static uint8_t port_bits[65536 / 8];
static int enabled;
static uint32_t head_bytes = DEFAULT_HEAD;
static uint64_t capacity = DEFAULT_CAPACITY;
static char directory[4096];

static pthread_mutex_t file_lock = PTHREAD_MUTEX_INITIALIZER;
static uint8_t *volatile map;       /* the record file, once opened */
/* The process the tables belong to.  A vfork child shares them until it
   execs, and must not touch them (its close() calls are its own). */
static pid_t owner;
static int file_failed;
static uint32_t connection_counter;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* -- the record file ------------------------------------------------------ */

static uint8_t *open_file(void) {
    uint8_t *m = __atomic_load_n(&map, __ATOMIC_ACQUIRE);
    if (m || file_failed) return m;
    pthread_mutex_lock(&file_lock);
    if (!map && !file_failed) {
        /* tap-<pid>.bin, or tap-<pid>-<n>.bin if an earlier program of this
           process (before an exec) left one: never overwrite records. */
        char path[4200];
        int fd = -1;
        for (int n = 0; n < 100 && fd < 0; n++) {
            if (n)
                snprintf(path, sizeof path, "%s/tap-%d-%d.bin", directory, (int)getpid(), n);
            else
                snprintf(path, sizeof path, "%s/tap-%d.bin", directory, (int)getpid());
            fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
            if (fd < 0 && errno != EEXIST) break;
        }
        void *mapped = MAP_FAILED;
        if (fd >= 0 && ftruncate(fd, (off_t)capacity) == 0)
            mapped = mmap(NULL, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int failure = errno;
        if (fd >= 0) real_close(fd);
        if (mapped == MAP_FAILED) {
            file_failed = 1;
            fprintf(stderr, "tf-grpc-bench wiretap: cannot map %s: %s; this process is not recorded\n",
                    path, strerror(failure));
        } else {
            uint8_t *h = mapped;
            memcpy(h, "TFGBTAP1", 8);
            put32(h + 8, TAP_VERSION);
            put32(h + 12, (uint32_t)getpid());
            put32(h + 16, (uint32_t)getppid());
            put32(h + 20, head_bytes);
            put64(h + 24, capacity);
            put64(h + 40, 0);
            put64(h + 48, now_ns());
            __atomic_store_n((uint64_t *)(h + 32), (uint64_t)HEADER_BYTES, __ATOMIC_RELEASE);
            __atomic_store_n(&map, h, __ATOMIC_RELEASE);
        }
    }
    pthread_mutex_unlock(&file_lock);
    return __atomic_load_n(&map, __ATOMIC_ACQUIRE);
}

/* Append one record: 24-byte head plus payload; the length is stored last. */
static void emit_took(uint16_t type, uint32_t connection, uint64_t time_ns, uint32_t took_ns,
                      const uint8_t *payload, size_t payload_len) {
    uint8_t *m = open_file();
    if (!m) return;
    uint64_t length = (24 + payload_len + 7) & ~(uint64_t)7;
    if (length > 0xffffffffULL) {
        __atomic_fetch_add((uint64_t *)(m + 40), 1, __ATOMIC_RELAXED);
        return;
    }
    uint64_t at = __atomic_fetch_add((uint64_t *)(m + 32), length, __ATOMIC_ACQ_REL);
    if (at + length > capacity) {
        __atomic_fetch_add((uint64_t *)(m + 40), 1, __ATOMIC_RELAXED);
        return;
    }
    uint8_t *r = m + at;
    put16(r + 4, type);
    put16(r + 6, 0);
    put32(r + 8, connection);
    put32(r + 12, took_ns);
    put64(r + 16, time_ns);
    if (payload_len) memcpy(r + 24, payload, payload_len);
    __atomic_store_n((uint32_t *)r, (uint32_t)length, __ATOMIC_RELEASE);
}

static void emit(uint16_t type, uint32_t connection, uint64_t time_ns, const uint8_t *payload,
                 size_t payload_len) {
    emit_took(type, connection, time_ns, 0, payload, payload_len);
}

/* -- which sockets ---------------------------------------------------------- */

static int port_listed(uint16_t port) { return port_bits[port >> 3] & (1 << (port & 7)); }

static void address_of(const struct sockaddr_storage *s, uint16_t *port, uint8_t out[16]) {
    memset(out, 0, 16);
    if (s->ss_family == AF_INET) {
        const struct sockaddr_in *a = (const struct sockaddr_in *)s;
        *port = ntohs(a->sin_port);
        memcpy(out, &a->sin_addr, 4);
    } else {
        const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)s;
        *port = ntohs(a->sin6_port);
        memcpy(out, &a->sin6_addr, 16);
    }
}

static struct connection *look_at(int fd) {
    int type = 0;
    socklen_t type_len = sizeof type;
    struct sockaddr_storage local, peer;
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    int saved = errno;
    struct connection *result = IGNORED;
    if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &type_len) == 0 && type == SOCK_STREAM &&
        getsockname(fd, (struct sockaddr *)&local, &local_len) == 0 &&
        getpeername(fd, (struct sockaddr *)&peer, &peer_len) == 0 &&
        (local.ss_family == AF_INET || local.ss_family == AF_INET6) &&
        local.ss_family == peer.ss_family) {
        uint16_t local_port, peer_port;
        uint8_t payload[48];
        address_of(&local, &local_port, payload + 8);
        address_of(&peer, &peer_port, payload + 24);
        int server = port_listed(local_port);
        if (server || port_listed(peer_port)) {
            struct connection *c = calloc(1, sizeof *c);
            if (c) {
                pthread_mutex_init(&c->lock, NULL);
                c->number = __atomic_add_fetch(&connection_counter, 1, __ATOMIC_RELAXED);
                c->state = server ? S_FRAME_HEADER : S_PREFACE;
                c->left = server ? 0 : PREFACE_BYTES;
                put16(payload, local.ss_family);
                put16(payload + 2, server ? 1 : 0);
                put16(payload + 4, local_port);
                put16(payload + 6, peer_port);
                put32(payload + 40, (uint32_t)fd);
                put32(payload + 44, 0);
                memcpy(c->announce, payload, sizeof payload);
                result = c;
            }
        }
    }
    errno = saved;
    return result;
}

static struct connection *connection_of(int fd) {
    if (!enabled || fd < 0 || fd >= MAX_FDS) return NULL;
    struct connection *c = fds[fd];
    if (!c) {
        struct connection *found = look_at(fd);
        struct connection *expected = NULL;
        if (__atomic_compare_exchange_n(&fds[fd], &expected, found, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_ACQUIRE)) {
            c = found;
            /* Announced only once it is the fd's: a racing loser leaves no trace. */
            if (c != IGNORED)
                emit(RECORD_CONNECTION, c->number, now_ns(), c->announce, sizeof c->announce);
        } else {
            if (found != IGNORED) {
                free(found); /* another thread got there first: drop ours, unrecorded */
            }
            c = expected;
        }
    }
    return c == IGNORED ? NULL : c;
}

static void forget(int fd) {
    if (!enabled || fd < 0 || fd >= MAX_FDS) return;
    struct connection *c = fds[fd];
    if (!c) return;
    /* A vfork child (posix_spawn closing descriptors before its exec) shares these tables:
       it must not end the parent's connections.  getpid() is a system call, so it is asked
       only of a followed connection's close, never of a send. */
    if (c != IGNORED && getpid() != owner) return;
    c = __atomic_exchange_n(&fds[fd], NULL, __ATOMIC_ACQ_REL);
    if (c && c != IGNORED) {
        emit(RECORD_CLOSED, c->number, now_ns(), NULL, 0);
        /* Not freed: a send racing with close may still hold it (a few KB per connection). */
    }
}

/* -- building a SENT record ------------------------------------------------ */

static int reserve(struct connection *c, size_t more) {
    if (c->scratch_len + more <= c->scratch_capacity) return 1;
    size_t size = c->scratch_capacity ? c->scratch_capacity : 4096;
    while (size < c->scratch_len + more) size *= 2;
    uint8_t *grown = realloc(c->scratch, size);
    if (!grown) {
        c->broken = 1;
        return 0;
    }
    c->scratch = grown;
    c->scratch_capacity = size;
    return 1;
}

static void op_feed(struct connection *c, const uint8_t *bytes, uint32_t count) {
    if (!count) return;
    c->skip_at = 0;
    if (c->feed_at) { /* extend the open feed op */
        size_t at = c->feed_at - 1;
        uint32_t had;
        memcpy(&had, c->scratch + at, 4);
        size_t padded_had = (had + 3u) & ~(size_t)3;
        size_t padded_new = ((size_t)had + count + 3u) & ~(size_t)3;
        if ((size_t)had + count > MAX_OP || !reserve(c, padded_new - padded_had)) {
            c->feed_at = 0;
            op_feed(c, bytes, count);
            return;
        }
        uint8_t *data = c->scratch + at + 4;
        memcpy(data + had, bytes, count);
        memset(data + had + count, 0, padded_new - had - count);
        c->scratch_len = at + 4 + padded_new;
        put32(c->scratch + at, had + count);
        return;
    }
    size_t padded = (count + 3u) & ~(size_t)3;
    if (!reserve(c, 4 + padded)) return;
    c->feed_at = c->scratch_len + 1;
    put32(c->scratch + c->scratch_len, count);
    memcpy(c->scratch + c->scratch_len + 4, bytes, count);
    memset(c->scratch + c->scratch_len + 4 + count, 0, padded - count);
    c->scratch_len += 4 + padded;
}

static void op_skip(struct connection *c, uint32_t count) {
    if (!count) return;
    c->feed_at = 0;
    if (c->skip_at) { /* extend the skip op just before */
        uint32_t had;
        memcpy(&had, c->scratch + c->skip_at - 1, 4);
        had &= MAX_OP;
        if ((uint64_t)had + count <= MAX_OP) {
            put32(c->scratch + c->skip_at - 1, SKIP_BIT | (had + count));
            return;
        }
    }
    if (!reserve(c, 4)) return;
    c->skip_at = c->scratch_len + 1;
    put32(c->scratch + c->scratch_len, SKIP_BIT | count);
    c->scratch_len += 4;
}

/* -- framing ------------------------------------------------------------------ */

static struct stream *stream_of(struct connection *c, uint32_t id) {
    if (c->current && c->current->id == id) return c->current;
    for (uint32_t i = 0; i < c->stream_count; i++)
        if (c->streams[i].id == id) return c->current = &c->streams[i];
    if (c->stream_count == c->stream_capacity) {
        uint32_t size = c->stream_capacity ? c->stream_capacity * 2 : 64;
        struct stream *grown = realloc(c->streams, size * sizeof *grown);
        if (!grown) {
            c->broken = 1;
            return NULL;
        }
        c->streams = grown;
        c->stream_capacity = size;
    }
    struct stream *s = &c->streams[c->stream_count++];
    memset(s, 0, sizeof *s);
    s->id = id;
    return c->current = s;
}

static void drop_stream(struct connection *c, uint32_t id) {
    for (uint32_t i = 0; i < c->stream_count; i++) {
        if (c->streams[i].id == id) {
            c->streams[i] = c->streams[--c->stream_count];
            c->current = NULL;
            return;
        }
    }
}

static void data_done(struct connection *c) {
    if (c->end_stream) drop_stream(c, c->stream_id);
    if (c->padding) {
        c->left = c->padding;
        c->padding = 0;
        c->state = S_DATA_PADDING;
    } else {
        c->state = S_FRAME_HEADER;
    }
}

static void start_frame(struct connection *c) {
    const uint8_t *h = c->header;
    uint32_t length = (uint32_t)h[0] << 16 | (uint32_t)h[1] << 8 | h[2];
    uint8_t type = h[3], flags = h[4];
    uint32_t id = ((uint32_t)h[5] << 24 | (uint32_t)h[6] << 16 | (uint32_t)h[7] << 8 | h[8]) &
                  0x7fffffffu;
    c->left = length;
    if (type == TYPE_DATA) {
        c->stream_id = id;
        c->end_stream = flags & FLAG_END_STREAM;
        c->padding = 0;
        if (flags & FLAG_PADDED && length) {
            c->state = S_DATA_PAD_LENGTH;
        } else {
            c->state = S_DATA;
            if (!length) data_done(c);
        }
        return;
    }
    if (type == TYPE_RST_STREAM || (type == TYPE_HEADERS && flags & FLAG_END_STREAM))
        drop_stream(c, id);
    c->state = length ? S_FRAME_BODY : S_FRAME_HEADER;
}

/* The payload bytes of the current DATA frame: gRPC message framing. */
static void data_bytes(struct connection *c, const uint8_t *p, uint32_t n) {
    struct stream *s = stream_of(c, c->stream_id);
    if (!s) {
        op_feed(c, p, n);
        return;
    }
    while (n) {
        uint32_t take;
        if (!s->in_message) {
            take = GRPC_PREFIX_BYTES - s->prefix_len;
            if (take > n) take = n;
            /* The length sits in prefix bytes 1-4: keep a copy to read it. */
            for (uint32_t i = 0; i < take; i++) {
                uint32_t at = s->prefix_len + i;
                if (at >= 1) s->remaining = (at == 1 ? 0 : s->remaining << 8) | p[i];
            }
            s->prefix_len += take;
            op_feed(c, p, take);
            if (s->prefix_len == GRPC_PREFIX_BYTES) {
                s->prefix_len = 0;
                s->head_left = s->remaining < head_bytes ? s->remaining : head_bytes;
                s->in_message = s->remaining > 0;
            }
        } else if (s->head_left) {
            take = s->head_left < n ? s->head_left : n;
            op_feed(c, p, take);
            s->head_left -= take;
            s->remaining -= take;
            if (!s->remaining) s->in_message = 0;
        } else {
            take = s->remaining < n ? s->remaining : n;
            op_skip(c, take);
            s->remaining -= take;
            if (!s->remaining) s->in_message = 0;
        }
        p += take;
        n -= take;
    }
}

static void follow(struct connection *c, const uint8_t *p, size_t n) {
    while (n) {
        uint32_t take;
        switch (c->state) {
        case S_FRAME_HEADER:
            take = FRAME_HEADER_BYTES - c->header_len;
            if (take > n) take = (uint32_t)n;
            memcpy(c->header + c->header_len, p, take);
            c->header_len += take;
            op_feed(c, p, take);
            if (c->header_len == FRAME_HEADER_BYTES) {
                c->header_len = 0;
                start_frame(c);
            }
            break;
        case S_DATA_PAD_LENGTH:
            take = 1;
            op_feed(c, p, 1);
            c->padding = p[0] < c->left ? p[0] : c->left - 1;
            c->left -= 1 + c->padding;
            c->state = S_DATA;
            if (!c->left) data_done(c);
            break;
        case S_DATA:
            take = c->left < n ? c->left : (uint32_t)n;
            data_bytes(c, p, take);
            c->left -= take;
            if (!c->left) data_done(c);
            break;
        default: /* S_PREFACE, S_FRAME_BODY, S_DATA_PADDING: kept whole */
            take = c->left < n ? c->left : (uint32_t)n;
            op_feed(c, p, take);
            c->left -= take;
            if (!c->left) c->state = S_FRAME_HEADER;
            break;
        }
        p += take;
        n -= take;
    }
}

/* When a send on fd began, if fd may be followed (0 otherwise: no clock read). */
static uint64_t began(int fd) {
    if (!enabled || fd < 0 || fd >= MAX_FDS || fds[fd] == IGNORED) return 0;
    return now_ns();
}

static void record_sent(int fd, const struct iovec *iov, int iovcnt, ssize_t sent,
                        uint64_t began_ns) {
    if (sent <= 0) return;
    /* No getpid() check here (a system call per send doubled the tasks' system calls on a
       shaped link): a vfork child does not send on its parent's gRPC connections. */
    struct connection *c = connection_of(fd);
    if (!c) return;
    uint64_t t = now_ns();
    uint64_t took = began_ns && t > began_ns ? t - began_ns : 0;
    if (took > 0xffffffffULL) took = 0xffffffffULL;
    pthread_mutex_lock(&c->lock);
    if (c->broken) {
        pthread_mutex_unlock(&c->lock);
        return;
    }
    c->scratch_len = 0;
    c->feed_at = c->skip_at = 0;
    size_t left = (size_t)sent;
    for (int i = 0; i < iovcnt && left; i++) {
        size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;
        const uint8_t *base = iov[i].iov_base;
        /* Skip ops hold at most 31 bits: cut huge segments. */
        while (n) {
            size_t piece = n < MAX_OP ? n : MAX_OP;
            follow(c, base, piece);
            base += piece;
            n -= piece;
            left -= piece;
        }
    }
    if (c->broken)
        emit(RECORD_LOST, c->number, t, NULL, 0); /* the ops are incomplete: dropped */
    else
        emit_took(RECORD_SENT, c->number, t, (uint32_t)took, c->scratch, c->scratch_len);
    pthread_mutex_unlock(&c->lock);
}

/* -- the wrapped calls ------------------------------------------------------- */

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
    uint64_t t0 = began(fd);
    ssize_t r = REAL(sendmsg)(fd, msg, flags);
    if (r > 0) record_sent(fd, msg->msg_iov, (int)msg->msg_iovlen, r, t0);
    return r;
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    uint64_t t0 = began(fd);
    ssize_t r = REAL(send)(fd, buf, len, flags);
    if (r > 0) {
        struct iovec v = {(void *)buf, len};
        record_sent(fd, &v, 1, r, t0);
    }
    return r;
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to,
               socklen_t to_len) {
    uint64_t t0 = began(fd);
    ssize_t r = REAL(sendto)(fd, buf, len, flags, to, to_len);
    if (r > 0) {
        struct iovec v = {(void *)buf, len};
        record_sent(fd, &v, 1, r, t0);
    }
    return r;
}

ssize_t write(int fd, const void *buf, size_t len) {
    uint64_t t0 = began(fd);
    ssize_t r = REAL(write)(fd, buf, len);
    if (r > 0 && enabled && fd >= 0 && fd < MAX_FDS && fds[fd] != IGNORED) {
        struct iovec v = {(void *)buf, len};
        record_sent(fd, &v, 1, r, t0);
    }
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt) {
    uint64_t t0 = began(fd);
    ssize_t r = REAL(writev)(fd, iov, iovcnt);
    if (r > 0) record_sent(fd, iov, iovcnt, r, t0);
    return r;
}

int close(int fd) {
    forget(fd);
    return REAL(close)(fd);
}

int dup2(int old_fd, int new_fd) {
    int r = REAL(dup2)(old_fd, new_fd);
    if (r >= 0 && old_fd != new_fd) forget(new_fd);
    return r;
}

int dup3(int old_fd, int new_fd, int flags) {
    int r = REAL(dup3)(old_fd, new_fd, flags);
    if (r >= 0) forget(new_fd);
    return r;
}

/* -- set-up ---------------------------------------------------------------------- */

static void after_fork_in_child(void) {
    /* The child is a new process: its own file, and no inherited framing state. */
    owner = getpid();
    map = NULL;
    file_failed = 0;
    for (int fd = 0; fd < MAX_FDS; fd++) fds[fd] = NULL;
}

__attribute__((constructor)) static void set_up(void) {
    real_sendmsg = dlsym(RTLD_NEXT, "sendmsg");
    real_send = dlsym(RTLD_NEXT, "send");
    real_sendto = dlsym(RTLD_NEXT, "sendto");
    real_write = dlsym(RTLD_NEXT, "write");
    real_writev = dlsym(RTLD_NEXT, "writev");
    real_close = dlsym(RTLD_NEXT, "close");
    real_dup2 = dlsym(RTLD_NEXT, "dup2");
    real_dup3 = dlsym(RTLD_NEXT, "dup3");
    const char *dir = getenv("TFGB_WIRETAP_DIR");
    const char *ports = getenv("TFGB_WIRETAP_PORTS");
    if (!dir || !*dir || !ports || strlen(dir) >= sizeof directory) return;
    strcpy(directory, dir);
    for (const char *p = ports; *p;) {
        char *end;
        long port = strtol(p, &end, 10);
        if (end == p) break;
        if (port > 0 && port < 65536) port_bits[port >> 3] |= (uint8_t)(1 << (port & 7));
        p = *end ? end + 1 : end;
    }
    const char *head = getenv("TFGB_WIRETAP_HEAD");
    if (head && *head) head_bytes = (uint32_t)strtoul(head, NULL, 10);
    const char *bytes = getenv("TFGB_WIRETAP_BYTES");
    if (bytes && *bytes) {
        unsigned long long wanted = strtoull(bytes, NULL, 10);
        if (wanted >= 1 << 20) capacity = wanted;
    }
    owner = getpid();
    pthread_atfork(NULL, NULL, after_fork_in_child);
    enabled = 1;
}
