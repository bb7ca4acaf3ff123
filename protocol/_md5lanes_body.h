/*
 * One function of protocol/_md5lanes.c: the MD5 of up to LANES buffers at once, written
 * once over the vector type and operations the including file defines (LANES_NAME,
 * LANES_ATTRIBUTE, LANES, VEC, ADD, SET1, ROL, LOAD, STORE, SELECT, F1-F4, TRANSPOSE),
 * which are forgotten at the end for the next kind of lanes.
 */
/* a + k + m does not wait for the step before: the chain of steps is F, an addition, the
 * rotation and an addition. */
#define MD5_STEP(FN, a, b, c, d, m, k, s) \
    a = ADD(b, ROL(ADD(FN(b, c, d), ADD(a, ADD(m, SET1(k)))), s))


LANES_ATTRIBUTE static void LANES_NAME(lane_t *lanes, int n, unsigned char (*out)[16]) {
    VEC a = SET1(0x67452301), b = SET1(0xefcdab89), c = SET1(0x98badcfe),
        d = SET1(0x10325476);
    size_t most = 0;
    for (int j = 0; j < n; j++)
        if (lanes[j].blocks > most) most = lanes[j].blocks;
    uint32_t active[LANES] __attribute__((aligned(64)));
    const unsigned char *p[LANES];
    for (size_t blk = 0; blk < most; blk++) {
        for (int j = 0; j < LANES; j++) {
            p[j] = j < n ? lane_block(&lanes[j], blk) : ZERO_BLOCK;
            active[j] = (j < n && blk < lanes[j].blocks) ? 0xffffffffu : 0;
        }
        VEC m[16];
        TRANSPOSE(m, p);
        VEC aa = a, bb = b, cc = c, dd = d;
        MD5_STEP(F1, a, b, c, d, m[0], 0xd76aa478, 7);
        MD5_STEP(F1, d, a, b, c, m[1], 0xe8c7b756, 12);
        MD5_STEP(F1, c, d, a, b, m[2], 0x242070db, 17);
        MD5_STEP(F1, b, c, d, a, m[3], 0xc1bdceee, 22);
        MD5_STEP(F1, a, b, c, d, m[4], 0xf57c0faf, 7);
        MD5_STEP(F1, d, a, b, c, m[5], 0x4787c62a, 12);
        MD5_STEP(F1, c, d, a, b, m[6], 0xa8304613, 17);
        MD5_STEP(F1, b, c, d, a, m[7], 0xfd469501, 22);
        MD5_STEP(F1, a, b, c, d, m[8], 0x698098d8, 7);
        MD5_STEP(F1, d, a, b, c, m[9], 0x8b44f7af, 12);
        MD5_STEP(F1, c, d, a, b, m[10], 0xffff5bb1, 17);
        MD5_STEP(F1, b, c, d, a, m[11], 0x895cd7be, 22);
        MD5_STEP(F1, a, b, c, d, m[12], 0x6b901122, 7);
        MD5_STEP(F1, d, a, b, c, m[13], 0xfd987193, 12);
        MD5_STEP(F1, c, d, a, b, m[14], 0xa679438e, 17);
        MD5_STEP(F1, b, c, d, a, m[15], 0x49b40821, 22);
        MD5_STEP(F2, a, b, c, d, m[1], 0xf61e2562, 5);
        MD5_STEP(F2, d, a, b, c, m[6], 0xc040b340, 9);
        MD5_STEP(F2, c, d, a, b, m[11], 0x265e5a51, 14);
        MD5_STEP(F2, b, c, d, a, m[0], 0xe9b6c7aa, 20);
        MD5_STEP(F2, a, b, c, d, m[5], 0xd62f105d, 5);
        MD5_STEP(F2, d, a, b, c, m[10], 0x02441453, 9);
        MD5_STEP(F2, c, d, a, b, m[15], 0xd8a1e681, 14);
        MD5_STEP(F2, b, c, d, a, m[4], 0xe7d3fbc8, 20);
        MD5_STEP(F2, a, b, c, d, m[9], 0x21e1cde6, 5);
        MD5_STEP(F2, d, a, b, c, m[14], 0xc33707d6, 9);
        MD5_STEP(F2, c, d, a, b, m[3], 0xf4d50d87, 14);
        MD5_STEP(F2, b, c, d, a, m[8], 0x455a14ed, 20);
        MD5_STEP(F2, a, b, c, d, m[13], 0xa9e3e905, 5);
        MD5_STEP(F2, d, a, b, c, m[2], 0xfcefa3f8, 9);
        MD5_STEP(F2, c, d, a, b, m[7], 0x676f02d9, 14);
        MD5_STEP(F2, b, c, d, a, m[12], 0x8d2a4c8a, 20);
        MD5_STEP(F3, a, b, c, d, m[5], 0xfffa3942, 4);
        MD5_STEP(F3, d, a, b, c, m[8], 0x8771f681, 11);
        MD5_STEP(F3, c, d, a, b, m[11], 0x6d9d6122, 16);
        MD5_STEP(F3, b, c, d, a, m[14], 0xfde5380c, 23);
        MD5_STEP(F3, a, b, c, d, m[1], 0xa4beea44, 4);
        MD5_STEP(F3, d, a, b, c, m[4], 0x4bdecfa9, 11);
        MD5_STEP(F3, c, d, a, b, m[7], 0xf6bb4b60, 16);
        MD5_STEP(F3, b, c, d, a, m[10], 0xbebfbc70, 23);
        MD5_STEP(F3, a, b, c, d, m[13], 0x289b7ec6, 4);
        MD5_STEP(F3, d, a, b, c, m[0], 0xeaa127fa, 11);
        MD5_STEP(F3, c, d, a, b, m[3], 0xd4ef3085, 16);
        MD5_STEP(F3, b, c, d, a, m[6], 0x04881d05, 23);
        MD5_STEP(F3, a, b, c, d, m[9], 0xd9d4d039, 4);
        MD5_STEP(F3, d, a, b, c, m[12], 0xe6db99e5, 11);
        MD5_STEP(F3, c, d, a, b, m[15], 0x1fa27cf8, 16);
        MD5_STEP(F3, b, c, d, a, m[2], 0xc4ac5665, 23);
        MD5_STEP(F4, a, b, c, d, m[0], 0xf4292244, 6);
        MD5_STEP(F4, d, a, b, c, m[7], 0x432aff97, 10);
        MD5_STEP(F4, c, d, a, b, m[14], 0xab9423a7, 15);
        MD5_STEP(F4, b, c, d, a, m[5], 0xfc93a039, 21);
        MD5_STEP(F4, a, b, c, d, m[12], 0x655b59c3, 6);
        MD5_STEP(F4, d, a, b, c, m[3], 0x8f0ccc92, 10);
        MD5_STEP(F4, c, d, a, b, m[10], 0xffeff47d, 15);
        MD5_STEP(F4, b, c, d, a, m[1], 0x85845dd1, 21);
        MD5_STEP(F4, a, b, c, d, m[8], 0x6fa87e4f, 6);
        MD5_STEP(F4, d, a, b, c, m[15], 0xfe2ce6e0, 10);
        MD5_STEP(F4, c, d, a, b, m[6], 0xa3014314, 15);
        MD5_STEP(F4, b, c, d, a, m[13], 0x4e0811a1, 21);
        MD5_STEP(F4, a, b, c, d, m[4], 0xf7537e82, 6);
        MD5_STEP(F4, d, a, b, c, m[11], 0xbd3af235, 10);
        MD5_STEP(F4, c, d, a, b, m[2], 0x2ad7d2bb, 15);
        MD5_STEP(F4, b, c, d, a, m[9], 0xeb86d391, 21);
        VEC keep = LOAD(active);
        a = SELECT(keep, ADD(a, aa), aa);
        b = SELECT(keep, ADD(b, bb), bb);
        c = SELECT(keep, ADD(c, cc), cc);
        d = SELECT(keep, ADD(d, dd), dd);
    }
    uint32_t state[4][LANES] __attribute__((aligned(64)));
    STORE(state[0], a);
    STORE(state[1], b);
    STORE(state[2], c);
    STORE(state[3], d);
    for (int j = 0; j < n; j++)
        for (int w = 0; w < 4; w++)
            for (int i = 0; i < 4; i++)
                out[j][4 * w + i] = (unsigned char)(state[w][j] >> (8 * i));
}

#undef MD5_STEP
#undef LANES_NAME
#undef LANES_ATTRIBUTE
#undef LANES
#undef VEC
#undef ADD
#undef SET1
#undef ROL
#undef LOAD
#undef STORE
#undef SELECT
#undef F1
#undef F2
#undef F3
#undef F4
#undef TRANSPOSE
