// The activation math of the CPU kernels: the shared functors of common/activation_math.h
// instantiated on at::vec::Vectorized<A> (A = float, or double for fp64 inputs), with the
// vector primitives of kernels/cpu/vec_math.h. Row tails go through the same functors with
// partial loads, so every element of a row gets the same computation.
#pragma once

#include <ATen/cpu/vec/vec.h>

#include "common/activation_math.h"
#include "kernels/cpu/vec_math.h"
#include "ops/activation.h"

namespace te_cpp::cpu {

// Act -> (act functor, lin functor) on vectors of A.
template <Act K, typename A>
using ActTraits = math::ActMath<K, at::vec::Vectorized<A>>;

template <Act K, typename A>
using Gated = math::Gated<K, at::vec::Vectorized<A>>;

// No activation (the type of a null activation pointer in the linear epilogue).
template <typename A>
using Identity = math::Identity<at::vec::Vectorized<A>>;

}  // namespace te_cpp::cpu
