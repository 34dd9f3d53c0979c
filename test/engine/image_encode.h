/*
 * image_encode.h — images encoded in memory for the media tests
 * (image_encode.c).  The encoders append the file to out and return 1, or
 * 0 when encoding failed.
 */
#ifndef G4_TEST_IMAGE_ENCODE_H
#define G4_TEST_IMAGE_ENCODE_H

#include <stdint.h>

#include "util.h"

/* w x h pixels of 8-bit RGB noise from seed, malloc'd; NULL when out of
 * memory. */
uint8_t    *h_noise_rgb(int w, int h, uint64_t seed);

/* Progressive (libjpeg's simple progression), quality 90. */
int			h_encode_jpeg_progressive(const uint8_t *rgb, int w, int h, g4_buf *out);
/* Interlaced (Adam7), stored without compression. */
int			h_encode_png_interlaced(const uint8_t *rgb, int w, int h, g4_buf *out);
/* 256 grey levels, the red channel as the indices. */
int			h_encode_gif(const uint8_t *rgb, int w, int h, g4_buf *out);
/* From RGB (channels 3) or RGBA (4), lossy at quality 50 or lossless, at
 * the encoder's fastest method. */
int			h_encode_webp(const uint8_t *pixels, int channels, int w, int h, int lossless, g4_buf *out);

#endif
