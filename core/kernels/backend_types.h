// Opaque CUDA handle types, declared exactly as the CUDA headers declare them, so kernel headers can
// name the CUDA entry points without pulling the toolkit's headers into every CPU translation unit.
#pragma once

typedef struct CUstream_st* cudaStream_t;
typedef struct cublasContext* cublasHandle_t;
