// Eigen for the CPU kernels, included through here only.
//
// Note [Eigen under GCC 12]: GCC 12 reports -Wmaybe-uninitialized inside the AVX-512 intrinsics
// that Eigen's packet math inlines (`__m512 __Y = __Y;` in _mm512_undefined_ps), a known false
// positive; the pragma silences it for Eigen's headers and nothing else.
#pragma once

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <Eigen/Core>
#pragma GCC diagnostic pop
