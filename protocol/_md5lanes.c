/*
 * MD5 of several buffers at once, each in a lane of one SIMD register (multi-buffer
 * hashing).
 *
 * MD5 is sequential within a message: one stream runs at the speed of its chain of
 * additions and rotations. The MD5s of independent buffers can run side by side: each
 * step of the 64 is one vector instruction for 4, 8 or 16 buffers. brokerd signs every
 * frame with the MD5 of its payload (R-DLG-8), and a large message leaves as several
 * frames, so their signatures are taken together (protocol.digests).
 *
 * The widths: 16 lanes (AVX-512F, 512-bit registers), 8 lanes (AVX-512VL, 256-bit; on a
 * CPU whose 512-bit operations are two 256-bit halves, a half-full 16-lane pass costs
 * about what a full 8-lane one does) and 4 lanes (128-bit), 8 lanes with AVX2 (no
 * rotation nor three-input logic instruction: two shifts and an OR, two or three logic
 * operations), and 4 lanes with SSE2, which every x86-64 CPU has. Elsewhere the module builds and says it has no
 * lanes, and protocol.digests uses hashlib. The rounds are written once, in
 * _md5lanes_body.h, included here once for each kind of lanes.
 *
 * digest(buffers) -> list of 16-byte digests, in order. Buffers of unequal length share a
 * pass: a lane whose message has fewer blocks keeps its state once they are done. The
 * GIL is released while hashing; the buffers are held (PyObject_GetBuffer) until then.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_LANES 1
#else
#define HAVE_LANES 0
#endif

#define MAX_LANES 16

/* One lane's message: its full blocks in place, its last one or two blocks (the rest of
 * the bytes, 0x80, zeros, the length in bits) in a buffer of its own. */
typedef struct {
    const unsigned char *data;
    size_t full;   /* blocks read from data */
    size_t blocks; /* full + the padded tail's 1 or 2 */
    unsigned char tail[128];
} lane_t;

static void lane_init(lane_t *lane, const unsigned char *data, size_t len) {
    size_t rest = len % 64;
    lane->data = data;
    lane->full = len / 64;
    lane->blocks = lane->full + (rest < 56 ? 1 : 2);
    memset(lane->tail, 0, sizeof lane->tail);
    if (rest) memcpy(lane->tail, data + lane->full * 64, rest);
    lane->tail[rest] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    unsigned char *end = lane->tail + (lane->blocks - lane->full) * 64 - 8;
    for (int i = 0; i < 8; i++) end[i] = (unsigned char)(bits >> (8 * i));
}

static const unsigned char ZERO_BLOCK[64];

static inline const unsigned char *lane_block(const lane_t *lane, size_t b) {
    if (b < lane->full) return lane->data + 64 * b;
    if (b < lane->blocks) return lane->tail + 64 * (b - lane->full);
    return ZERO_BLOCK;
}

#if HAVE_LANES

/* Each lane's block is loaded as it lies (x86 is little-endian, as MD5's words are) and
 * the lanes' rows transposed into the 16 words' vectors with shuffles, instead of word
 * by word through memory (which took half the time of a 16-lane pass). */

/* 16 rows of 16 words: within each 128-bit quarter, 4x4 blocks by unpacking words and
 * pairs of words; then the quarters of each group of four rows, 4x4 again. */
__attribute__((target("avx512f"))) static inline void transpose_x16(
    __m512i m[16], const unsigned char *const p[16]) {
    __m512i r[16], t[16];
    for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_si512((const void *)p[j]);
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
    }
    /* s[g][c]: quarter k holds word 4k + c of rows 4g .. 4g + 3 */
    __m512i s[4][4];
    for (int g = 0; g < 4; g++) {
        __m512i *q = t + 4 * g;
        s[g][0] = _mm512_unpacklo_epi64(q[0], q[2]);
        s[g][1] = _mm512_unpackhi_epi64(q[0], q[2]);
        s[g][2] = _mm512_unpacklo_epi64(q[1], q[3]);
        s[g][3] = _mm512_unpackhi_epi64(q[1], q[3]);
    }
    for (int c = 0; c < 4; c++) {
        __m512i u0 = _mm512_shuffle_i32x4(s[0][c], s[1][c], 0x44);
        __m512i u1 = _mm512_shuffle_i32x4(s[0][c], s[1][c], 0xEE);
        __m512i u2 = _mm512_shuffle_i32x4(s[2][c], s[3][c], 0x44);
        __m512i u3 = _mm512_shuffle_i32x4(s[2][c], s[3][c], 0xEE);
        m[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
        m[4 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
        m[8 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
        m[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
    }
}

/* 8 rows of 16 words: two 8x8 transposes (words 0-7, then 8-15). */
#define TRANSPOSE_X8_BODY                                                                   \
    for (int h = 0; h < 2; h++) {                                                           \
        __m256i r[8], t[8], s[8];                                                           \
        for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_si256((const __m256i *)(p[j] + 32 * h)); \
        for (int j = 0; j < 8; j += 2) {                                                    \
            t[j] = _mm256_unpacklo_epi32(r[j], r[j + 1]);                                   \
            t[j + 1] = _mm256_unpackhi_epi32(r[j], r[j + 1]);                               \
        }                                                                                   \
        for (int g = 0; g < 8; g += 4) {                                                    \
            s[g] = _mm256_unpacklo_epi64(t[g], t[g + 2]);                                   \
            s[g + 1] = _mm256_unpackhi_epi64(t[g], t[g + 2]);                               \
            s[g + 2] = _mm256_unpacklo_epi64(t[g + 1], t[g + 3]);                           \
            s[g + 3] = _mm256_unpackhi_epi64(t[g + 1], t[g + 3]);                           \
        }                                                                                   \
        for (int c = 0; c < 4; c++) {                                                       \
            m[8 * h + c] = _mm256_permute2x128_si256(s[c], s[4 + c], 0x20);                 \
            m[8 * h + 4 + c] = _mm256_permute2x128_si256(s[c], s[4 + c], 0x31);             \
        }                                                                                   \
    }
__attribute__((target("avx2"))) static inline void transpose_x8(
    __m256i m[16], const unsigned char *const p[8]) {
    TRANSPOSE_X8_BODY
}
__attribute__((target("avx512f,avx512vl"))) static inline void transpose_x8vl(
    __m256i m[16], const unsigned char *const p[8]) {
    TRANSPOSE_X8_BODY
}

/* 4 rows of 16 words: four 4x4 transposes. */
#define TRANSPOSE_X4_BODY                                                                   \
    for (int q = 0; q < 4; q++) {                                                           \
        __m128i r0 = _mm_loadu_si128((const __m128i *)(p[0] + 16 * q));                     \
        __m128i r1 = _mm_loadu_si128((const __m128i *)(p[1] + 16 * q));                     \
        __m128i r2 = _mm_loadu_si128((const __m128i *)(p[2] + 16 * q));                     \
        __m128i r3 = _mm_loadu_si128((const __m128i *)(p[3] + 16 * q));                     \
        __m128i t0 = _mm_unpacklo_epi32(r0, r1), t1 = _mm_unpacklo_epi32(r2, r3);           \
        __m128i t2 = _mm_unpackhi_epi32(r0, r1), t3 = _mm_unpackhi_epi32(r2, r3);           \
        m[4 * q] = _mm_unpacklo_epi64(t0, t1);                                              \
        m[4 * q + 1] = _mm_unpackhi_epi64(t0, t1);                                          \
        m[4 * q + 2] = _mm_unpacklo_epi64(t2, t3);                                          \
        m[4 * q + 3] = _mm_unpackhi_epi64(t2, t3);                                          \
    }
static inline void transpose_x4(__m128i m[16], const unsigned char *const p[4]) {
    TRANSPOSE_X4_BODY
}
__attribute__((target("avx512f,avx512vl"))) static inline void transpose_x4vl(
    __m128i m[16], const unsigned char *const p[4]) {
    TRANSPOSE_X4_BODY
}

/* Each kind of lanes: its vector type and operations, then _md5lanes_body.h makes the
 * function (and forgets the macros for the next kind). */

/* 16 lanes, AVX-512F: rotation and three-input logic are one instruction each. */
#define LANES_NAME md5_x16
#define LANES_ATTRIBUTE __attribute__((target("avx512f")))
#define LANES 16
#define VEC __m512i
#define ADD _mm512_add_epi32
#define SET1(x) _mm512_set1_epi32((int)(x))
#define ROL(x, s) _mm512_rol_epi32(x, s)
#define LOAD(p) _mm512_load_si512((const void *)(p))
#define STORE(p, v) _mm512_store_si512((void *)(p), v)
#define SELECT(m, x, y) _mm512_ternarylogic_epi32(m, x, y, 0xCA)
#define F1(b, c, d) _mm512_ternarylogic_epi32(b, c, d, 0xCA)
#define F2(b, c, d) _mm512_ternarylogic_epi32(b, c, d, 0xE4)
#define F3(b, c, d) _mm512_ternarylogic_epi32(b, c, d, 0x96)
#define F4(b, c, d) _mm512_ternarylogic_epi32(b, c, d, 0x39)
#define TRANSPOSE transpose_x16
#include "_md5lanes_body.h"

/* 8 lanes, AVX-512VL: the same instructions on 256-bit registers. */
#define LANES_NAME md5_x8vl
#define LANES_ATTRIBUTE __attribute__((target("avx512f,avx512vl")))
#define LANES 8
#define VEC __m256i
#define ADD _mm256_add_epi32
#define SET1(x) _mm256_set1_epi32((int)(x))
#define ROL(x, s) _mm256_rol_epi32(x, s)
#define LOAD(p) _mm256_load_si256((const __m256i *)(p))
#define STORE(p, v) _mm256_store_si256((__m256i *)(p), v)
#define SELECT(m, x, y) _mm256_ternarylogic_epi32(m, x, y, 0xCA)
#define F1(b, c, d) _mm256_ternarylogic_epi32(b, c, d, 0xCA)
#define F2(b, c, d) _mm256_ternarylogic_epi32(b, c, d, 0xE4)
#define F3(b, c, d) _mm256_ternarylogic_epi32(b, c, d, 0x96)
#define F4(b, c, d) _mm256_ternarylogic_epi32(b, c, d, 0x39)
#define TRANSPOSE transpose_x8vl
#include "_md5lanes_body.h"

/* 8 lanes, AVX2: rotation as two shifts and an OR; F = d ^ (b & (c ^ d)) and so on. */
#define LANES_NAME md5_x8
#define LANES_ATTRIBUTE __attribute__((target("avx2")))
#define LANES 8
#define VEC __m256i
#define ADD _mm256_add_epi32
#define SET1(x) _mm256_set1_epi32((int)(x))
#define ROL(x, s) _mm256_or_si256(_mm256_slli_epi32(x, s), _mm256_srli_epi32(x, 32 - (s)))
#define LOAD(p) _mm256_load_si256((const __m256i *)(p))
#define STORE(p, v) _mm256_store_si256((__m256i *)(p), v)
#define SELECT(m, x, y) _mm256_blendv_epi8(y, x, m)
#define F1(b, c, d) _mm256_xor_si256(d, _mm256_and_si256(b, _mm256_xor_si256(c, d)))
#define F2(b, c, d) _mm256_xor_si256(c, _mm256_and_si256(d, _mm256_xor_si256(b, c)))
#define F3(b, c, d) _mm256_xor_si256(_mm256_xor_si256(b, c), d)
#define F4(b, c, d) \
    _mm256_xor_si256(c, _mm256_or_si256(b, _mm256_xor_si256(d, _mm256_set1_epi32(-1))))
#define TRANSPOSE transpose_x8
#include "_md5lanes_body.h"

/* 4 lanes, AVX-512VL: the same instructions on 128-bit registers. */
#define LANES_NAME md5_x4vl
#define LANES_ATTRIBUTE __attribute__((target("avx512f,avx512vl")))
#define LANES 4
#define VEC __m128i
#define ADD _mm_add_epi32
#define SET1(x) _mm_set1_epi32((int)(x))
#define ROL(x, s) _mm_rol_epi32(x, s)
#define LOAD(p) _mm_load_si128((const __m128i *)(p))
#define STORE(p, v) _mm_store_si128((__m128i *)(p), v)
#define SELECT(m, x, y) _mm_ternarylogic_epi32(m, x, y, 0xCA)
#define F1(b, c, d) _mm_ternarylogic_epi32(b, c, d, 0xCA)
#define F2(b, c, d) _mm_ternarylogic_epi32(b, c, d, 0xE4)
#define F3(b, c, d) _mm_ternarylogic_epi32(b, c, d, 0x96)
#define F4(b, c, d) _mm_ternarylogic_epi32(b, c, d, 0x39)
#define TRANSPOSE transpose_x4vl
#include "_md5lanes_body.h"

/* 4 lanes, SSE2: every x86-64 CPU. */
#define LANES_NAME md5_x4
#define LANES_ATTRIBUTE
#define LANES 4
#define VEC __m128i
#define ADD _mm_add_epi32
#define SET1(x) _mm_set1_epi32((int)(x))
#define ROL(x, s) _mm_or_si128(_mm_slli_epi32(x, s), _mm_srli_epi32(x, 32 - (s)))
#define LOAD(p) _mm_load_si128((const __m128i *)(p))
#define STORE(p, v) _mm_store_si128((__m128i *)(p), v)
#define SELECT(m, x, y) _mm_or_si128(_mm_and_si128(m, x), _mm_andnot_si128(m, y))
#define F1(b, c, d) _mm_xor_si128(d, _mm_and_si128(b, _mm_xor_si128(c, d)))
#define F2(b, c, d) _mm_xor_si128(c, _mm_and_si128(d, _mm_xor_si128(b, c)))
#define F3(b, c, d) _mm_xor_si128(_mm_xor_si128(b, c), d)
#define F4(b, c, d) _mm_xor_si128(c, _mm_or_si128(b, _mm_xor_si128(d, _mm_set1_epi32(-1))))
#define TRANSPOSE transpose_x4
#include "_md5lanes_body.h"

typedef void (*lanes_fn)(lane_t *, int, unsigned char (*)[16]);

typedef struct {
    const char *name;
    lanes_fn fn;
    int lanes;
    const char *feature; /* what the CPU must have */
    const char *feature2;
} kind_t;

static const kind_t KINDS[] = {
    {"avx512", md5_x16, 16, "avx512f", NULL},
    {"avx512vl", md5_x8vl, 8, "avx512f", "avx512vl"},
    {"avx2", md5_x8, 8, "avx2", NULL},
    {"avx512vl-4", md5_x4vl, 4, "avx512f", "avx512vl"},
    {"sse2", md5_x4, 4, "sse2", NULL},
};
#define N_KINDS ((int)(sizeof KINDS / sizeof KINDS[0]))

static int supported(const kind_t *kind) {
    /* __builtin_cpu_supports takes a literal: compare the names instead. */
    const char *need[2] = {kind->feature, kind->feature2};
    for (int i = 0; i < 2; i++) {
        const char *f = need[i];
        if (f == NULL) continue;
        int ok = strcmp(f, "avx512f") == 0    ? __builtin_cpu_supports("avx512f")
                 : strcmp(f, "avx512vl") == 0 ? __builtin_cpu_supports("avx512vl")
                 : strcmp(f, "avx2") == 0     ? __builtin_cpu_supports("avx2")
                                              : __builtin_cpu_supports("sse2");
        if (!ok) return 0;
    }
    return 1;
}

static lanes_fn BEST_16; /* 16 lanes, or NULL */
static lanes_fn BEST_8;  /* 8 lanes, or NULL */
static lanes_fn BEST_4;  /* 4 lanes */

static void choose(void) {
    __builtin_cpu_init();
    BEST_16 = supported(&KINDS[0]) ? md5_x16 : NULL;
    BEST_8 = supported(&KINDS[1]) ? md5_x8vl : supported(&KINDS[2]) ? md5_x8 : NULL;
    BEST_4 = supported(&KINDS[3]) ? md5_x4vl : md5_x4;
}

/* Hash n buffers, 16 at a time where the CPU can; a last group of at most 8 (4) takes
 * the narrower lanes, which cost less than a wide pass with idle lanes. With ``only``,
 * every group takes that kind's lanes. */
static void hash_all(lane_t *lanes, Py_ssize_t n, unsigned char (*out)[16],
                     const kind_t *only) {
    Py_ssize_t i = 0;
    while (i < n) {
        Py_ssize_t left = n - i;
        lanes_fn fn = BEST_4;
        int width = 4;
        if (only != NULL) {
            fn = only->fn;
            width = only->lanes;
        } else if (left > 8 && BEST_16 != NULL) {
            fn = BEST_16;
            width = 16;
        } else if (left > 4 && BEST_8 != NULL) {
            fn = BEST_8;
            width = 8;
        }
        int take = left < width ? (int)left : width;
        fn(lanes + i, take, out + i);
        i += take;
    }
}
#endif /* HAVE_LANES */

PyDoc_STRVAR(digest_doc,
             "digest(buffers, kind='')\n--\n\n"
             "The MD5 digests (16 bytes each) of a sequence of bytes-like objects, in order,\n"
             "computed several at a time in SIMD lanes: the widest this CPU has, or those of\n"
             "``kind`` (one of KINDS; for tests and benchmarks).");

static PyObject *digest(PyObject *module, PyObject *args, PyObject *kwargs) {
    (void)module;
    static char *keywords[] = {"buffers", "kind", NULL};
    PyObject *arg;
    const char *kind_name = "";
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|s:digest", keywords, &arg, &kind_name))
        return NULL;
#if HAVE_LANES
    const kind_t *only = NULL;
    if (kind_name[0] != '\0') {
        for (int k = 0; k < N_KINDS; k++)
            if (strcmp(KINDS[k].name, kind_name) == 0 && supported(&KINDS[k])) only = &KINDS[k];
        if (only == NULL) {
            PyErr_Format(PyExc_ValueError, "no MD5 lanes of kind '%s' on this CPU", kind_name);
            return NULL;
        }
    }
    PyObject *seq = PySequence_Fast(arg, "digest() takes a sequence of bytes-like objects");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_buffer *views = PyMem_Calloc(n ? n : 1, sizeof(Py_buffer));
    lane_t *lanes = PyMem_Malloc((n ? n : 1) * sizeof(lane_t));
    unsigned char(*out)[16] = PyMem_Malloc((n ? n : 1) * 16);
    PyObject *result = NULL;
    Py_ssize_t held = 0;
    if (views == NULL || lanes == NULL || out == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; held < n; held++) {
        if (PyObject_GetBuffer(items[held], &views[held], PyBUF_SIMPLE) < 0) goto done;
    }
    Py_BEGIN_ALLOW_THREADS;
    for (Py_ssize_t i = 0; i < n; i++)
        lane_init(&lanes[i], views[i].buf, (size_t)views[i].len);
    hash_all(lanes, n, out, only);
    Py_END_ALLOW_THREADS;
    result = PyList_New(n);
    if (result == NULL) goto done;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *d = PyBytes_FromStringAndSize((const char *)out[i], 16);
        if (d == NULL) {
            Py_CLEAR(result);
            goto done;
        }
        PyList_SET_ITEM(result, i, d);
    }
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(lanes);
    PyMem_Free(out);
    Py_DECREF(seq);
    return result;
#else
    (void)arg;
    (void)kind_name;
    PyErr_SetString(PyExc_RuntimeError, "no SIMD lanes on this platform");
    return NULL;
#endif
}

static PyMethodDef methods[] = {
    {"digest", (PyCFunction)(void (*)(void))digest, METH_VARARGS | METH_KEYWORDS, digest_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT, "protocol._md5lanes",
    "MD5 of several buffers at once, in SIMD lanes (see protocol.digests).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__md5lanes(void) {
    PyObject *module = PyModule_Create(&module_def);
    if (module == NULL) return NULL;
    PyObject *kinds = PyList_New(0);
    if (kinds == NULL) goto fail;
#if HAVE_LANES
    choose();
    for (int k = 0; k < N_KINDS; k++) {
        if (!supported(&KINDS[k])) continue;
        PyObject *name = PyUnicode_FromString(KINDS[k].name);
        if (name == NULL || PyList_Append(kinds, name) < 0) {
            Py_XDECREF(name);
            Py_DECREF(kinds);
            goto fail;
        }
        Py_DECREF(name);
    }
#endif
    PyObject *names = PyList_AsTuple(kinds);
    Py_DECREF(kinds);
    if (names == NULL || PyModule_AddObject(module, "KINDS", names) < 0) {
        Py_XDECREF(names);
        goto fail;
    }
    return module;
fail:
    Py_DECREF(module);
    return NULL;
}
