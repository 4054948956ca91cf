/* The C ABI's error paths on a machine without a GPU (or without a driver or NCCL): every
 * call returns a status and leaves a message, never crashes and never writes to stderr (only
 * this program's own FAIL lines go there), even from a thread's exit.
 *
 * no_gpu VERSION MISSING_PACKAGE INVALID_LADDER_PACKAGE NCCL_ONLY_PACKAGE
 * Started by crates/prepare-c/tests/c_abi/c_program.rs with no torchrun variables set. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "prepare.h"

static int failures = 0;

/* Checks a status and that the last error contains `needle` (NULL: anything non-empty). */
static void expect(const char *what, PrepareStatus got, PrepareStatus want, const char *needle) {
    const char *message = prepare_last_error();
    if (got != want) {
        fprintf(stderr, "FAIL %s: status %d, expected %d (last error: %s)\n", what, (int)got,
                (int)want, message);
        failures++;
        return;
    }
    if (want != PREPARE_STATUS_OK) {
        if (message == NULL || message[0] == '\0' ||
            (needle != NULL && strstr(message, needle) == NULL)) {
            fprintf(stderr, "FAIL %s: last error \"%s\" does not name \"%s\"\n", what,
                    message ? message : "(null)", needle ? needle : "anything");
            failures++;
            return;
        }
    }
    printf("ok   %s: %s\n", what, want == PREPARE_STATUS_OK ? "ok" : message);
}

/* A failing call from a thread-specific value's destructor, which runs after the thread's own
 * thread-local storage is gone: a status and a message, not an abort. */
static pthread_key_t exit_key;
static PrepareStatus exit_status = PREPARE_STATUS_OK;
static char exit_message[256];

static void at_thread_exit(void *value) {
    (void)value;
    exit_status = prepare_options_init(NULL);
    const char *message = prepare_last_error();
    snprintf(exit_message, sizeof exit_message, "%s", message ? message : "(null)");
}

static void *thread_body(void *unused) {
    (void)unused;
    /* A failure first, so the thread's last error is in use when the thread ends. */
    prepare_options_init(NULL);
    pthread_setspecific(exit_key, &exit_key);
    return NULL;
}

static void expect_thread_exit(void) {
    pthread_t thread;
    if (pthread_key_create(&exit_key, at_thread_exit) != 0 ||
        pthread_create(&thread, NULL, thread_body, NULL) != 0 ||
        pthread_join(thread, NULL) != 0) {
        fprintf(stderr, "FAIL thread exit: cannot start a thread\n");
        failures++;
        return;
    }
    if (exit_status != PREPARE_STATUS_INVALID_ARGUMENT || strstr(exit_message, "options") == NULL) {
        fprintf(stderr, "FAIL options_init(NULL) at thread exit: status %d (%s)\n",
                (int)exit_status, exit_message);
        failures++;
        return;
    }
    printf("ok   options_init(NULL) at thread exit: %s\n", exit_message);
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: no_gpu VERSION MISSING INVALID_LADDER NCCL_ONLY\n");
        return 2;
    }
    const char *version = argv[1];
    const char *missing = argv[2];
    const char *invalid_ladder = argv[3];
    const char *nccl_only = argv[4];

    if (strcmp(prepare_version(), version) != 0) {
        fprintf(stderr, "FAIL version: \"%s\", expected \"%s\"\n", prepare_version(), version);
        failures++;
    }
    if (prepare_abi_version() != PREPARE_ABI_VERSION || PREPARE_ABI_VERSION != 2) {
        fprintf(stderr, "FAIL abi version: %u, the header says %u\n", prepare_abi_version(),
                (unsigned)PREPARE_ABI_VERSION);
        failures++;
    }
    if (PREPARE_COLLECTIVE_ALL_REDUCE != 0 || PREPARE_COLLECTIVE_REDUCE_SCATTER != 1 ||
        PREPARE_COLLECTIVE_ALL_GATHER != 2 || PREPARE_COLLECTIVE_ALL_REDUCE_ADD_RMS_NORM != 3) {
        fprintf(stderr, "FAIL PrepareCollective: not the documented values\n");
        failures++;
    }
    if (strcmp(prepare_last_error(), "") != 0) {
        fprintf(stderr, "FAIL last error before any call: \"%s\"\n", prepare_last_error());
        failures++;
    }

    expect("options_init(NULL)", prepare_options_init(NULL), PREPARE_STATUS_INVALID_ARGUMENT,
           "options");
    PrepareOptions options;
    memset(&options, 0xAB, sizeof options);
    expect("options_init", prepare_options_init(&options), PREPARE_STATUS_OK, NULL);
    if (options.packages != NULL || options.package_count != 0 || options.cache_dir != NULL ||
        options.timeout_seconds != 60.0 || options.tuning != PREPARE_TUNING_RUNTIME ||
        options.retune != 0 || options.allow_inexact != 0) {
        fprintf(stderr, "FAIL options_init: not the documented defaults\n");
        failures++;
    }

    PrepareHandle *handle = (PrepareHandle *)0x1;
    /* No torchrun variables: the first one read is named. */
    expect("open_env without torchrun variables", prepare_open_env(&options, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "WORLD_SIZE is not set");
    if (handle != (PrepareHandle *)0x1) {
        fprintf(stderr, "FAIL open_env wrote a handle on failure\n");
        failures++;
    }

    uint8_t id[PREPARE_UNIQUE_ID_BYTES] = {0};
    expect("open_unique_id(NULL options)", prepare_open_unique_id(NULL, id, 0, 2, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "options is NULL");
    expect("open_unique_id(NULL id)", prepare_open_unique_id(&options, NULL, 0, 2, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "unique_id is NULL");
    expect("open_unique_id(world 1)", prepare_open_unique_id(&options, id, 0, 1, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "2 or more ranks");
    expect("open_unique_id(rank 2 of 2)", prepare_open_unique_id(&options, id, 2, 2, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "rank 2 of 2");
    expect("open_unique_id(device -1)", prepare_open_unique_id(&options, id, 0, 2, -1, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "device -1");
    expect("open_unique_id(no package)", prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "options.packages is empty");

    const char *packages[1] = {NULL};
    options.packages = packages;
    options.package_count = 1;
    expect("open_unique_id(NULL package path)",
           prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "options.packages[0] is NULL");

    packages[0] = missing;
    expect("open_unique_id(missing package)",
           prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
           PREPARE_STATUS_PACKAGE_REFUSED, missing);
    packages[0] = invalid_ladder;
    expect("open_unique_id(invalid ladder)",
           prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
           PREPARE_STATUS_PACKAGE_REFUSED, "ladder.json is not a valid ladder");
    expect("the invalid ladder's error names the JSON path", PREPARE_STATUS_PACKAGE_REFUSED,
           PREPARE_STATUS_PACKAGE_REFUSED, "/world_size");

    /* Counts past PREPARE_MAX_PACKAGES are refused before anything is read or allocated. */
    const size_t counts[] = {PREPARE_MAX_PACKAGES + 1, (size_t)1 << 40, SIZE_MAX};
    for (size_t index = 0; index < sizeof counts / sizeof counts[0]; index++) {
        char what[64];
        snprintf(what, sizeof what, "open_unique_id(package_count %zu)", counts[index]);
        options.package_count = counts[index];
        expect(what, prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
               PREPARE_STATUS_INVALID_ARGUMENT, "options.package_count");
    }
    options.package_count = 1;

    packages[0] = nccl_only;
    /* Above 0 and at most a day, or refused before the package is opened: no overflow of a
     * deadline (1e19), no zero duration (5e-324). */
    const double timeouts[] = {1e19, 86401.0, 5e-324, NAN, -1.0, 0.0, INFINITY};
    for (size_t index = 0; index < sizeof timeouts / sizeof timeouts[0]; index++) {
        char what[64];
        snprintf(what, sizeof what, "open_unique_id(timeout %g)", timeouts[index]);
        options.timeout_seconds = timeouts[index];
        expect(what, prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
               PREPARE_STATUS_INVALID_ARGUMENT, "options.timeout_seconds");
    }
    options.timeout_seconds = 1.0;
    options.tuning = 7;
    expect("open_unique_id(tuning 7)", prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "options.tuning is 7");
    options.tuning = PREPARE_TUNING_STATIC;
    /* The exactness switch takes 0 or 1 only: anything else is refused, never read as 1. */
    const int32_t inexact[] = {2, -1, INT32_MAX};
    for (size_t index = 0; index < sizeof inexact / sizeof inexact[0]; index++) {
        char what[64];
        char needle[64];
        snprintf(what, sizeof what, "open_unique_id(allow_inexact %d)", (int)inexact[index]);
        snprintf(needle, sizeof needle, "options.allow_inexact is %d", (int)inexact[index]);
        options.allow_inexact = inexact[index];
        expect(what, prepare_open_unique_id(&options, id, 0, 2, 0, &handle),
               PREPARE_STATUS_INVALID_ARGUMENT, needle);
    }
    options.allow_inexact = 1;
    options.cache_dir = "";
    expect("open_comm(NULL communicator)",
           prepare_open_comm(&options, NULL, 0, 2, 0, 0, &handle),
           PREPARE_STATUS_INVALID_ARGUMENT, "nccl_comm is NULL");

    /* A valid package: the start goes as far as the driver or NCCL. Without them (CI) it is a
     * runtime failure that says what is missing; with them, the bogus id's bootstrap times out
     * after 1 s. Never success, never a crash. */
    PrepareStatus started = prepare_open_unique_id(&options, id, 0, 2, 0, &handle);
    if (started == PREPARE_STATUS_RUNTIME_FAILURE || started == PREPARE_STATUS_PEER_TIMEOUT) {
        expect("open_unique_id(valid package, no peer)", started, started, "rank 0");
    } else {
        fprintf(stderr, "FAIL open_unique_id(valid package, no peer): status %d (%s)\n",
                (int)started, prepare_last_error());
        failures++;
    }

    uint8_t made[PREPARE_UNIQUE_ID_BYTES];
    expect("unique_id(NULL)", prepare_unique_id(NULL), PREPARE_STATUS_INVALID_ARGUMENT, "out");
    PrepareStatus made_status = prepare_unique_id(made);
    if (made_status == PREPARE_STATUS_RUNTIME_FAILURE) {
        expect("unique_id without NCCL", made_status, made_status, "NCCL");
    } else if (made_status != PREPARE_STATUS_OK) {
        fprintf(stderr, "FAIL unique_id: status %d (%s)\n", (int)made_status,
                prepare_last_error());
        failures++;
    }

    void *address = NULL;
    size_t bytes = 0;
    size_t needed = 0;
    char text[64];
    expect("all_reduce(NULL handle)", prepare_all_reduce(NULL, text, text, 1, 0, NULL),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    /* The reduce-scatter and the all-gather check the dtype and the shape before the handle. */
    typedef PrepareStatus (*RowCall)(const PrepareHandle *, const void *, void *, size_t, size_t,
                                     int32_t, void *);
    const struct {
        const char *name;
        RowCall call;
    } row_calls[] = {{"reduce_scatter", prepare_reduce_scatter},
                     {"all_gather", prepare_all_gather}};
    for (size_t index = 0; index < sizeof row_calls / sizeof row_calls[0]; index++) {
        char what[64];
        RowCall call = row_calls[index].call;
        snprintf(what, sizeof what, "%s(NULL handle)", row_calls[index].name);
        expect(what, call(NULL, text, text, 4, 3, PREPARE_DTYPE_BF16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
        snprintf(what, sizeof what, "%s(width 0)", row_calls[index].name);
        expect(what, call(NULL, text, text, 4, 0, PREPARE_DTYPE_BF16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "width must be at least 1");
        snprintf(what, sizeof what, "%s(dtype 7)", row_calls[index].name);
        expect(what, call(NULL, text, text, 4, 3, 7, NULL), PREPARE_STATUS_INVALID_ARGUMENT,
               "dtype 7 is not a PrepareDtype");
        snprintf(what, sizeof what, "%s(SIZE_MAX x 2 elements)", row_calls[index].name);
        expect(what, call(NULL, text, text, SIZE_MAX, 2, PREPARE_DTYPE_FP32, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "more than 2^64 - 1 elements");
        snprintf(what, sizeof what, "%s(2^63 elements of 4 bytes)", row_calls[index].name);
        expect(what, call(NULL, text, text, (size_t)1 << 32, (size_t)1 << 31, PREPARE_DTYPE_FP32,
                          NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "more than 2^64 - 1 bytes");
        snprintf(what, sizeof what, "%s(no rows, NULL operands, NULL handle)",
                 row_calls[index].name);
        expect(what, call(NULL, NULL, NULL, 0, 1, PREPARE_DTYPE_FP16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    }

    /* The v-forms check their counts (NULL, a sum that overflows), then the dtype and the
     * shape of their sum, before the handle. */
    typedef PrepareStatus (*RowCallV)(const PrepareHandle *, const void *, void *,
                                      const size_t *, uint32_t, size_t, int32_t, void *);
    const struct {
        const char *name;
        RowCallV call;
    } row_calls_v[] = {{"reduce_scatter_v", prepare_reduce_scatter_v},
                       {"all_gather_v", prepare_all_gather_v}};
    const size_t row_counts[3] = {2, 0, 5};
    const size_t overflowing[2] = {SIZE_MAX, 1};
    for (size_t index = 0; index < sizeof row_calls_v / sizeof row_calls_v[0]; index++) {
        char what[64];
        RowCallV call = row_calls_v[index].call;
        snprintf(what, sizeof what, "%s(NULL handle)", row_calls_v[index].name);
        expect(what, call(NULL, text, text, row_counts, 3, 4, PREPARE_DTYPE_BF16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
        snprintf(what, sizeof what, "%s(NULL counts)", row_calls_v[index].name);
        expect(what, call(NULL, text, text, NULL, 3, 4, PREPARE_DTYPE_BF16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "rows_per_rank is NULL");
        snprintf(what, sizeof what, "%s(overflowing counts)", row_calls_v[index].name);
        expect(what, call(NULL, text, text, overflowing, 2, 4, PREPARE_DTYPE_BF16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "sum to more than 2^64 - 1 rows");
        snprintf(what, sizeof what, "%s(width 0)", row_calls_v[index].name);
        expect(what, call(NULL, text, text, row_counts, 3, 0, PREPARE_DTYPE_BF16, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "7 rows of width 0");
        snprintf(what, sizeof what, "%s(dtype 7)", row_calls_v[index].name);
        expect(what, call(NULL, text, text, row_counts, 3, 4, 7, NULL),
               PREPARE_STATUS_INVALID_ARGUMENT, "dtype 7 is not a PrepareDtype");
    }

    /* The fused epilogue checks the dtype, the shape, the hidden size, eps and its operands
     * before the handle. */
    expect("all_reduce_add_rms_norm(NULL handle)",
           prepare_all_reduce_add_rms_norm(NULL, text, text, text, text, 2, 8, 1e-6f,
                                           PREPARE_DTYPE_BF16, NULL),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    expect("all_reduce_add_rms_norm(hidden 12)",
           prepare_all_reduce_add_rms_norm(NULL, text, text, text, text, 2, 12, 1e-6f,
                                           PREPARE_DTYPE_BF16, NULL),
           PREPARE_STATUS_INVALID_ARGUMENT, "hidden size of 12 elements is not taken");
    expect("all_reduce_add_rms_norm(eps -1)",
           prepare_all_reduce_add_rms_norm(NULL, text, NULL, text, text, 2, 8, -1.0f,
                                           PREPARE_DTYPE_FP16, NULL),
           PREPARE_STATUS_INVALID_ARGUMENT, "eps is -1");
    expect("all_reduce_add_rms_norm(NULL weight)",
           prepare_all_reduce_add_rms_norm(NULL, text, text, NULL, text, 2, 8, 0.0f,
                                           PREPARE_DTYPE_FP32, NULL),
           PREPARE_STATUS_INVALID_ARGUMENT, "weight is NULL");

    /* The shape rule: the first rows % world ranks own one row more; a rank may own none. */
    const size_t owned_cases[][5] = {
        /* rows, world, rank, first, count */
        {10, 4, 0, 0, 3}, {10, 4, 1, 3, 3}, {10, 4, 2, 6, 2}, {10, 4, 3, 8, 2},
        {2, 4, 3, 2, 0},  {8, 2, 1, 4, 4},  {0, 3, 2, 0, 0},
    };
    for (size_t index = 0; index < sizeof owned_cases / sizeof owned_cases[0]; index++) {
        const size_t *row = owned_cases[index];
        size_t first = SIZE_MAX;
        size_t count = SIZE_MAX;
        char what[64];
        snprintf(what, sizeof what, "owned_rows(%zu rows, rank %zu of %zu)", row[0], row[2],
                 row[1]);
        expect(what, prepare_owned_rows(row[0], (uint32_t)row[1], (uint32_t)row[2], &first,
                                        &count),
               PREPARE_STATUS_OK, NULL);
        if (first != row[3] || count != row[4]) {
            fprintf(stderr, "FAIL %s: rows %zu..%zu, expected %zu..%zu\n", what, first,
                    first + count, row[3], row[3] + row[4]);
            failures++;
        }
    }
    expect("owned_rows(NULL outputs)", prepare_owned_rows(5, 2, 1, NULL, NULL), PREPARE_STATUS_OK,
           NULL);
    expect("owned_rows(rank 2 of 2)", prepare_owned_rows(5, 2, 2, NULL, NULL),
           PREPARE_STATUS_INVALID_ARGUMENT, "rank 2 is not below the world size 2");

    expect("route(NULL handle)", prepare_route(NULL, PREPARE_COLLECTIVE_ALL_REDUCE, 0, 2, text,
                                                  sizeof text, &needed),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    expect("choice_json(NULL handle)",
           prepare_choice_json(NULL, PREPARE_COLLECTIVE_ALL_REDUCE, 0, text, sizeof text, &needed),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    int32_t served = 0;
    expect("serves(NULL handle)", prepare_serves(NULL, PREPARE_COLLECTIVE_ALL_REDUCE, 0, &served),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    expect("zero_copy_region(NULL handle)",
           prepare_zero_copy_region(NULL, PREPARE_COLLECTIVE_ALL_REDUCE, 0, &address, &bytes),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    expect("force(NULL handle)", prepare_force(NULL, PREPARE_COLLECTIVE_ALL_REDUCE, 0, 0, "nccl"),
           PREPARE_STATUS_INVALID_ARGUMENT, "handle is NULL");
    expect("check(NULL handle)", prepare_check(NULL), PREPARE_STATUS_INVALID_ARGUMENT,
           "handle is NULL");
    expect("close(NULL)", prepare_close(NULL), PREPARE_STATUS_OK, NULL);
    expect_thread_exit();

    if (failures > 0) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("every check passed\n");
    return 0;
}
