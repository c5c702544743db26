/*
 * kern-capture: a CUPTI injection library that dumps every loaded module and
 * every kernel launch of an unmodified CUDA process.
 *
 * Loaded by the CUDA driver through CUDA_INJECTION64_PATH, which calls
 * InitializeInjection() once per process at cuInit. Writes into the directory
 * named by KERN_CAPTURE_OUT (the first process of a command takes the
 * directory itself, further processes take DIR/pid<N>/):
 *
 *   capture.json        process info, written at start
 *   module_<id>.<kind>  each module's image, at CUPTI's MODULE_LOADED callback
 *   modules.jsonl       one line per module
 *   launches.jsonl      one line per launch (format: kern_capture/records.py)
 *   error.json          only when the capture could not start
 *
 * Launches are recorded from the DRIVER_API callback domain only, at the
 * exit of cuLaunchKernel / cuLaunchKernelEx / cuLaunchCooperativeKernel and
 * their _ptsz variants: runtime-API launches arrive through these too, so each
 * launch is recorded exactly once. Recording at exit (with the timestamp taken
 * at entry) means a lazily loaded module has been loaded by then.
 *
 * Locking rule: one mutex (g_lock) guards every table and the writer, and NO
 * CUDA driver call is made while it is held (the driver may hold its own lock
 * while it calls our MODULE_LOADED callback, which takes g_lock).
 * Recursion rule: driver calls made by this library from inside a callback
 * may re-enter the callback; a thread-local flag makes those no-ops.
 *
 * Environment:
 *   KERN_CAPTURE_OUT       output directory (default ./kern-capture-<pid>)
 *   KERN_CAPTURE_BUFFERED  1: buffer launch lines (64 KiB, flushed at every
 *                          module load, every 100 ms and at exit) instead of
 *                          one write(2) per launch; faster, loses the last
 *                          lines if the target is killed
 *   KERN_CAPTURE_QUIET     1: no banner on stderr
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <cupti.h>
#include <dlfcn.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#ifndef KERN_CAPTURE_VERSION
#define KERN_CAPTURE_VERSION "dev"
#endif

#define EXPORT __attribute__((visibility("default")))
#define MAX_PARAMS 1024
#define EXTRA_HEX_MAX 4096

/* ------------------------------------------------------------------ */
/* Driver entry points, resolved from the already loaded libcuda.      */
/* (No link-time dependency on libcuda: the library builds on machines */
/* without a driver.)                                                  */

typedef CUresult (*pfn_cuFuncGetName)(const char **, CUfunction);
typedef CUresult (*pfn_cuFuncGetModule)(CUmodule *, CUfunction);
typedef CUresult (*pfn_cuFuncGetParamInfo)(CUfunction, size_t, size_t *, size_t *);
typedef CUresult (*pfn_cuKernelGetParamInfo)(CUkernel, size_t, size_t *, size_t *);
typedef CUresult (*pfn_cuKernelGetFunction)(CUfunction *, CUkernel);
typedef CUresult (*pfn_cuFuncGetAttribute)(int *, CUfunction_attribute, CUfunction);
typedef CUresult (*pfn_cuMemGetAddressRange)(CUdeviceptr *, size_t *, CUdeviceptr);
typedef CUresult (*pfn_cuGetErrorName)(CUresult, const char **);

static struct {
  pfn_cuFuncGetName FuncGetName;
  pfn_cuFuncGetModule FuncGetModule;
  pfn_cuFuncGetParamInfo FuncGetParamInfo;
  pfn_cuKernelGetParamInfo KernelGetParamInfo;
  pfn_cuKernelGetFunction KernelGetFunction;
  pfn_cuFuncGetAttribute FuncGetAttribute;
  pfn_cuMemGetAddressRange MemGetAddressRange;
  pfn_cuGetErrorName GetErrorName;
} drv;

static void *resolve(void *h, const char *name) {
  void *p = h ? dlsym(h, name) : NULL;
  if (!p) p = dlsym(RTLD_DEFAULT, name);
  return p;
}

static int load_driver(void) {
  void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (!h) h = dlopen("libcuda.so.1", RTLD_NOW);
  if (!h) h = dlopen("libcuda.so", RTLD_NOW);
  if (!h && !dlsym(RTLD_DEFAULT, "cuInit")) return 0;
  drv.FuncGetName = (pfn_cuFuncGetName)resolve(h, "cuFuncGetName");
  drv.FuncGetModule = (pfn_cuFuncGetModule)resolve(h, "cuFuncGetModule");
  drv.FuncGetParamInfo = (pfn_cuFuncGetParamInfo)resolve(h, "cuFuncGetParamInfo");
  drv.KernelGetParamInfo = (pfn_cuKernelGetParamInfo)resolve(h, "cuKernelGetParamInfo");
  drv.KernelGetFunction = (pfn_cuKernelGetFunction)resolve(h, "cuKernelGetFunction");
  drv.FuncGetAttribute = (pfn_cuFuncGetAttribute)resolve(h, "cuFuncGetAttribute");
  drv.MemGetAddressRange = (pfn_cuMemGetAddressRange)resolve(h, "cuMemGetAddressRange_v2");
  drv.GetErrorName = (pfn_cuGetErrorName)resolve(h, "cuGetErrorName");
  return 1;
}

static const char *cu_err(CUresult r) {
  const char *s = NULL;
  if (drv.GetErrorName && drv.GetErrorName(r, &s) == CUDA_SUCCESS && s) return s;
  return "CUDA_ERROR_UNKNOWN";
}

/* ------------------------------------------------------------------ */
/* Small utilities                                                     */

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; ++s) {
    h ^= (unsigned char)*s;
    h *= 1099511628211ull;
  }
  return h;
}

typedef struct {
  char *p;
  size_t n, cap;
} sbuf;

static void sb_reserve(sbuf *b, size_t extra) {
  if (b->n + extra + 1 <= b->cap) return;
  size_t cap = b->cap ? b->cap : 1024;
  while (cap < b->n + extra + 1) cap *= 2;
  char *p = (char *)realloc(b->p, cap);
  if (!p) abort();
  b->p = p;
  b->cap = cap;
}

static void sb_putn(sbuf *b, const char *s, size_t n) {
  sb_reserve(b, n);
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = 0;
}

static void sb_puts(sbuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

static void sb_printf(sbuf *b, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char tmp[256];
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    sb_putn(b, tmp, (size_t)n);
    return;
  }
  sb_reserve(b, (size_t)n);
  va_start(ap, fmt);
  vsnprintf(b->p + b->n, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->n += (size_t)n;
}

static void sb_json_str(sbuf *b, const char *s) {
  sb_putn(b, "\"", 1);
  if (s) {
    for (const unsigned char *c = (const unsigned char *)s; *c; ++c) {
      if (*c == '"' || *c == '\\') {
        char e[2] = {'\\', (char)*c};
        sb_putn(b, e, 2);
      } else if (*c < 0x20 || *c == 0x7f) {
        sb_printf(b, "\\u%04x", *c);
      } else {
        sb_putn(b, (const char *)c, 1);
      }
    }
  }
  sb_putn(b, "\"", 1);
}

static void sb_hex(sbuf *b, const void *data, size_t n) {
  static const char digits[] = "0123456789abcdef";
  const unsigned char *d = (const unsigned char *)data;
  sb_reserve(b, 2 * n);
  for (size_t i = 0; i < n; ++i) {
    b->p[b->n++] = digits[d[i] >> 4];
    b->p[b->n++] = digits[d[i] & 15];
  }
  b->p[b->n] = 0;
}

static int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

static void mkdir_p(const char *path) {
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s", path);
  for (char *p = tmp + 1; *p; ++p) {
    if (*p == '/') {
      *p = 0;
      mkdir(tmp, 0777);
      *p = '/';
    }
  }
  mkdir(tmp, 0777);
}

/* ------------------------------------------------------------------ */
/* Global state (guarded by g_lock)                                    */

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_dir[4096];
static int g_pid;
static int g_launch_fd = -1, g_module_fd = -1;
static int g_buffered;
static sbuf g_wbuf;            /* buffered launch lines (KERN_CAPTURE_BUFFERED) */
static uint64_t g_last_flush;  /* ns */
static uint64_t g_seq;
static uint64_t g_nmodules;
static int g_active;           /* subscribed and writing */
static CUpti_SubscriberHandle g_sub;

/* Modules: id, function-symbol hashes (sorted), bound CUmodule handle. */
typedef struct {
  uint32_t id;
  int unloaded;
  CUmodule handle;
  uint64_t *syms;
  size_t nsyms;
} module_t;
static module_t *g_mods;
static size_t g_nmods, g_capmods;

/* Function info cache, keyed by the handle passed to the launch. Entries are
 * never freed (a pointer handed out stays valid); a module unload bumps the
 * generation so stale entries are recomputed. */
typedef struct {
  CUfunction key;
  uint64_t gen;
  char *symbol;
  CUfunction fn;          /* a CUfunction usable with cuFuncGet* (NULL if none) */
  int nparams;            /* -1: layout unavailable */
  size_t *offsets, *sizes;
  char *param_err;        /* why the layout is unavailable */
  int num_regs, static_smem;
  CUmodule module;        /* from cuFuncGetModule, NULL if unknown */
  int64_t module_id;      /* resolved module id, -1 until known (guarded by g_lock) */
  uint64_t module_try;    /* g_nmodules at the last failed resolution */
} func_t;
static func_t **g_funcs;  /* open addressing */
static size_t g_funcs_cap, g_funcs_n;
static uint64_t g_gen = 1;

/* Known device allocation ranges (cleared at every free). */
typedef struct {
  uint64_t base, size;
} range_t;
static range_t *g_ranges;
static size_t g_nranges, g_capranges;

/* Readable host mappings from /proc/self/maps. */
static range_t *g_maps;
static size_t g_nmaps, g_capmaps;
static uint64_t g_maps_time;

/* Per-thread state. */
static __thread int t_in_cb;       /* inside our own driver calls */
static __thread int t_tracking;    /* inside a tracked API call */
static __thread uint32_t t_pending[64];
static __thread int t_npending;
static __thread long t_tid;

/* ------------------------------------------------------------------ */
/* Writer                                                              */

static void flush_locked(void) {
  if (g_wbuf.n && g_launch_fd >= 0) write_all(g_launch_fd, g_wbuf.p, g_wbuf.n);
  g_wbuf.n = 0;
  g_last_flush = now_ns();
}

static void emit_launch_locked(const char *line, size_t n) {
  if (g_launch_fd < 0) return;
  if (!g_buffered) {
    write_all(g_launch_fd, line, n);
    return;
  }
  sb_putn(&g_wbuf, line, n);
  uint64_t t = now_ns();
  if (g_wbuf.n >= 65536 || t - g_last_flush > 100000000ull) flush_locked();
}

static void write_json_file(const char *dir, const char *name, const char *text) {
  char path[4200];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return;
  write_all(fd, text, strlen(text));
  close(fd);
}

/* ------------------------------------------------------------------ */
/* Modules                                                             */

static int cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Hashes of the STT_FUNC symbols of an ELF64 image (bounds-checked). */
static void elf_function_hashes(const unsigned char *img, size_t size, uint64_t **out, size_t *nout) {
  *out = NULL;
  *nout = 0;
  if (size < sizeof(Elf64_Ehdr) || memcmp(img, ELFMAG, SELFMAG) != 0 || img[EI_CLASS] != ELFCLASS64) return;
  const Elf64_Ehdr *eh = (const Elf64_Ehdr *)img;
  if (eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shoff == 0 || eh->e_shoff > size ||
      (uint64_t)eh->e_shnum * sizeof(Elf64_Shdr) > size - eh->e_shoff)
    return;
  const Elf64_Shdr *sh = (const Elf64_Shdr *)(img + eh->e_shoff);
  for (unsigned i = 0; i < eh->e_shnum; ++i) {
    if (sh[i].sh_type != SHT_SYMTAB) continue;
    if (sh[i].sh_link >= eh->e_shnum) continue;
    const Elf64_Shdr *st = &sh[sh[i].sh_link];
    if (sh[i].sh_offset > size || sh[i].sh_size > size - sh[i].sh_offset) continue;
    if (st->sh_offset > size || st->sh_size > size - st->sh_offset || st->sh_size == 0) continue;
    const char *strtab = (const char *)(img + st->sh_offset);
    size_t nsym = sh[i].sh_size / sizeof(Elf64_Sym);
    const Elf64_Sym *syms = (const Elf64_Sym *)(img + sh[i].sh_offset);
    uint64_t *h = (uint64_t *)malloc((nsym ? nsym : 1) * sizeof(uint64_t));
    if (!h) return;
    size_t n = 0;
    for (size_t k = 0; k < nsym; ++k) {
      if (ELF64_ST_TYPE(syms[k].st_info) != STT_FUNC) continue;
      if (syms[k].st_name >= st->sh_size) continue;
      const char *name = strtab + syms[k].st_name;
      if (!memchr(name, 0, st->sh_size - syms[k].st_name)) continue;
      h[n++] = fnv1a(name);
    }
    qsort(h, n, sizeof *h, cmp_u64);
    *out = h;
    *nout = n;
    return;
  }
}

static const char *module_kind(const unsigned char *p, size_t n, const char **ext) {
  if (n >= 4 && memcmp(p, ELFMAG, SELFMAG) == 0) return *ext = "cubin";
  if (n >= 4) {
    uint32_t m;
    memcpy(&m, p, 4);
    if (m == 0xBA55ED50u || m == 0x466243B1u) return *ext = "fatbin";
  }
  if (n > 0 && memmem(p, n < 4096 ? n : 4096, ".version", 8) && memmem(p, n < 4096 ? n : 4096, ".target", 7))
    return *ext = "ptx";
  *ext = "bin";
  return "unknown";
}

static module_t *find_module_locked(uint32_t id) {
  for (size_t i = g_nmods; i-- > 0;)
    if (g_mods[i].id == id) return &g_mods[i];
  return NULL;
}

static void on_module_loaded(CUcontext ctx, const CUpti_ModuleResourceData *md) {
  if (!md) return;
  const unsigned char *img = (const unsigned char *)md->pCubin;
  size_t size = img ? md->cubinSize : 0;
  const char *ext;
  const char *kind = module_kind(img, size, &ext);
  uint64_t *syms;
  size_t nsyms;
  elf_function_hashes(img, size, &syms, &nsyms);
  uint64_t t = now_ns();

  pthread_mutex_lock(&g_lock);
  if (g_nmods == g_capmods) {
    size_t cap = g_capmods ? 2 * g_capmods : 256;
    module_t *m = (module_t *)realloc(g_mods, cap * sizeof *m);
    if (!m) abort();
    g_mods = m;
    g_capmods = cap;
  }
  module_t *m = &g_mods[g_nmods++];
  memset(m, 0, sizeof *m);
  m->id = md->moduleId;
  m->syms = syms;
  m->nsyms = nsyms;
  g_nmodules++;
  if (t_tracking && t_npending < (int)(sizeof t_pending / sizeof t_pending[0])) t_pending[t_npending++] = md->moduleId;

  if (g_active) {
    char name[64], path[4200];
    snprintf(name, sizeof name, "module_%u.%s", md->moduleId, ext);
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      if (size) write_all(fd, (const char *)img, size);
      close(fd);
    }
    sbuf b = {0};
    sb_printf(&b, "{\"module_id\":%u,\"file\":\"%s\",\"kind\":\"%s\",\"size\":%zu,\"t_ns\":%llu,\"pid\":%d,\"ctx\":%llu}\n",
              md->moduleId, name, kind, size, (unsigned long long)t, g_pid, (unsigned long long)(uintptr_t)ctx);
    if (g_module_fd >= 0) write_all(g_module_fd, b.p, b.n);
    free(b.p);
    flush_locked(); /* keep launch lines and module lines roughly in step */
  }
  pthread_mutex_unlock(&g_lock);
}

static void on_module_unload(const CUpti_ModuleResourceData *md) {
  if (!md) return;
  pthread_mutex_lock(&g_lock);
  module_t *m = find_module_locked(md->moduleId);
  if (m) {
    m->unloaded = 1;
    m->handle = NULL;
  }
  g_gen++; /* function handles of that module may be reused */
  pthread_mutex_unlock(&g_lock);
}

static int module_has_symbol(const module_t *m, uint64_t h) {
  return m->syms && bsearch(&h, m->syms, m->nsyms, sizeof h, cmp_u64) != NULL;
}

/* Bind a CUmodule handle to a module id (the handle's previous binding, if
 * any, is dropped: a handle value can be reused after an unload). */
static void bind_locked(CUmodule handle, module_t *m) {
  for (size_t i = 0; i < g_nmods; ++i)
    if (g_mods[i].handle == handle) g_mods[i].handle = NULL;
  m->handle = handle;
}

/* CUmodule -> module id, or -1. Order: a bound handle; a module loaded during
 * this very API call (thread-local pending list) that has the symbol; the
 * only not-yet-bound module that has the symbol. */
static int64_t resolve_module_locked(CUmodule handle, const char *symbol) {
  if (!handle) return -1;
  for (size_t i = g_nmods; i-- > 0;)
    if (g_mods[i].handle == handle && !g_mods[i].unloaded) return g_mods[i].id;
  uint64_t h = symbol ? fnv1a(symbol) : 0;
  module_t *pick = NULL;
  int npick = 0;
  for (int k = t_npending - 1; k >= 0; --k) {
    module_t *m = find_module_locked(t_pending[k]);
    if (!m || m->unloaded || m->handle) continue;
    if (symbol && m->syms && !module_has_symbol(m, h)) continue;
    if (!pick) pick = m;
    npick++;
  }
  if (npick >= 1 && (npick == 1 || symbol)) {
    bind_locked(handle, pick);
    return pick->id;
  }
  if (!symbol) return -1;
  pick = NULL;
  npick = 0;
  for (size_t i = 0; i < g_nmods; ++i) {
    module_t *m = &g_mods[i];
    if (m->unloaded || m->handle || !module_has_symbol(m, h)) continue;
    pick = m;
    if (++npick > 1) break;
  }
  if (npick == 1) {
    bind_locked(handle, pick);
    return pick->id;
  }
  return -1;
}

/* ------------------------------------------------------------------ */
/* Function info                                                       */

static func_t *func_lookup_locked(CUfunction key) {
  if (!g_funcs_cap) return NULL;
  size_t mask = g_funcs_cap - 1;
  size_t i = (size_t)(((uintptr_t)key >> 4) * 11400714819323198485ull) & mask;
  for (;; i = (i + 1) & mask) {
    func_t *f = g_funcs[i];
    if (!f) return NULL;
    if (f->key == key) return f;
  }
}

static void func_insert_locked(func_t *nf) {
  if ((g_funcs_n + 1) * 2 > g_funcs_cap) {
    size_t cap = g_funcs_cap ? 2 * g_funcs_cap : 1024;
    func_t **t = (func_t **)calloc(cap, sizeof *t);
    if (!t) abort();
    for (size_t i = 0; i < g_funcs_cap; ++i) {
      func_t *f = g_funcs[i];
      if (!f) continue;
      size_t j = (size_t)(((uintptr_t)f->key >> 4) * 11400714819323198485ull) & (cap - 1);
      while (t[j]) j = (j + 1) & (cap - 1);
      t[j] = f;
    }
    free(g_funcs);
    g_funcs = t;
    g_funcs_cap = cap;
  }
  size_t mask = g_funcs_cap - 1;
  size_t i = (size_t)(((uintptr_t)nf->key >> 4) * 11400714819323198485ull) & mask;
  for (;; i = (i + 1) & mask) {
    if (!g_funcs[i]) {
      g_funcs[i] = nf;
      g_funcs_n++;
      return;
    }
    if (g_funcs[i]->key == nf->key) { /* replace a stale entry (old one leaks on purpose) */
      g_funcs[i] = nf;
      return;
    }
  }
}

/* Computed WITHOUT g_lock (driver calls). */
static func_t *func_compute(CUfunction key, const char *cb_symbol) {
  func_t *f = (func_t *)calloc(1, sizeof *f);
  if (!f) abort();
  f->key = key;
  f->nparams = -1;
  f->num_regs = -1;
  f->static_smem = -1;
  f->module_id = -1;
  f->module_try = (uint64_t)-1;
  const char *name = NULL;
  CUfunction fn = key;
  if (drv.FuncGetName && drv.FuncGetName(&name, key) != CUDA_SUCCESS) {
    name = NULL;
    fn = NULL;
    /* The handle may be a CUkernel cast to CUfunction (runtime API, CUDA 12+). */
    CUfunction k2 = NULL;
    if (drv.KernelGetFunction && drv.KernelGetFunction(&k2, (CUkernel)key) == CUDA_SUCCESS && k2) {
      fn = k2;
      if (drv.FuncGetName(&name, fn) != CUDA_SUCCESS) name = NULL;
    }
  }
  if (!name) name = cb_symbol;
  f->symbol = strdup(name ? name : "");
  f->fn = fn;

  /* Parameter layout: loop until CUDA_ERROR_INVALID_VALUE (past the end). */
  size_t offs[MAX_PARAMS], sizes[MAX_PARAMS];
  int n = 0;
  CUresult err = CUDA_SUCCESS;
  int via_kernel = 0;
  if (!drv.FuncGetParamInfo || !fn) {
    via_kernel = 1;
  }
  for (;;) {
    if (n == MAX_PARAMS) {
      err = CUDA_ERROR_NOT_SUPPORTED;
      break;
    }
    size_t o = 0, s = 0;
    CUresult r;
    if (!via_kernel)
      r = drv.FuncGetParamInfo(fn, (size_t)n, &o, &s);
    else if (drv.KernelGetParamInfo)
      r = drv.KernelGetParamInfo((CUkernel)key, (size_t)n, &o, &s);
    else
      r = CUDA_ERROR_NOT_SUPPORTED;
    if (r == CUDA_ERROR_INVALID_VALUE) break;
    if (r != CUDA_SUCCESS) {
      if (!via_kernel && n == 0 && drv.KernelGetParamInfo) {
        via_kernel = 1;
        continue;
      }
      err = r;
      break;
    }
    offs[n] = o;
    sizes[n] = s;
    n++;
  }
  if (err == CUDA_SUCCESS) {
    f->nparams = n;
    f->offsets = (size_t *)malloc((n ? n : 1) * sizeof(size_t));
    f->sizes = (size_t *)malloc((n ? n : 1) * sizeof(size_t));
    memcpy(f->offsets, offs, n * sizeof(size_t));
    memcpy(f->sizes, sizes, n * sizeof(size_t));
  } else {
    char msg[256];
    if (err == CUDA_ERROR_NOT_SUPPORTED && n == MAX_PARAMS)
      snprintf(msg, sizeof msg, "more than %d parameters", MAX_PARAMS);
    else
      snprintf(msg, sizeof msg, "cuFuncGetParamInfo failed at index %d: %s (%d)", n, cu_err(err), (int)err);
    f->param_err = strdup(msg);
  }
  if (fn && drv.FuncGetAttribute) {
    int v;
    if (drv.FuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_NUM_REGS, fn) == CUDA_SUCCESS) f->num_regs = v;
    if (drv.FuncGetAttribute(&v, CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn) == CUDA_SUCCESS) f->static_smem = v;
  }
  if (fn && drv.FuncGetModule) {
    CUmodule m = NULL;
    if (drv.FuncGetModule(&m, fn) == CUDA_SUCCESS) f->module = m;
  }
  return f;
}

/* ------------------------------------------------------------------ */
/* Pointer classification                                              */

static int range_find_locked(uint64_t v, range_t *out) {
  size_t lo = 0, hi = g_nranges;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_ranges[mid].base <= v) lo = mid + 1;
    else hi = mid;
  }
  if (lo == 0) return 0;
  range_t r = g_ranges[lo - 1];
  if (v - r.base < r.size) {
    *out = r;
    return 1;
  }
  return 0;
}

static void range_insert_locked(range_t r) {
  range_t tmp;
  if (range_find_locked(r.base, &tmp)) return;
  if (g_nranges == g_capranges) {
    size_t cap = g_capranges ? 2 * g_capranges : 256;
    range_t *p = (range_t *)realloc(g_ranges, cap * sizeof *p);
    if (!p) abort();
    g_ranges = p;
    g_capranges = cap;
  }
  size_t i = g_nranges;
  while (i > 0 && g_ranges[i - 1].base > r.base) {
    g_ranges[i] = g_ranges[i - 1];
    --i;
  }
  g_ranges[i] = r;
  g_nranges++;
}

static void maps_refresh_locked(void) {
  g_nmaps = 0;
  g_maps_time = now_ns();
  FILE *fp = fopen("/proc/self/maps", "re");
  if (!fp) return;
  char line[512];
  while (fgets(line, sizeof line, fp)) {
    unsigned long long a, b;
    char perms[8] = {0};
    if (sscanf(line, "%llx-%llx %7s", &a, &b, perms) != 3) continue;
    if (perms[0] != 'r') continue; /* PROT_NONE reservations (e.g. CUDA VA) are not host data */
    if (g_nmaps == g_capmaps) {
      size_t cap = g_capmaps ? 2 * g_capmaps : 1024;
      range_t *p = (range_t *)realloc(g_maps, cap * sizeof *p);
      if (!p) break;
      g_maps = p;
      g_capmaps = cap;
    }
    g_maps[g_nmaps].base = a;
    g_maps[g_nmaps].size = b - a;
    g_nmaps++;
  }
  fclose(fp);
}

static int in_maps_locked(uint64_t v) {
  size_t lo = 0, hi = g_nmaps;
  while (lo < hi) {
    size_t mid = (lo + hi) / 2;
    if (g_maps[mid].base <= v) lo = mid + 1;
    else hi = mid;
  }
  return lo > 0 && v - g_maps[lo - 1].base < g_maps[lo - 1].size;
}

/* A value worth asking the driver about: not tiny, not past 57-bit VA space. */
static int plausible_pointer(uint64_t v) { return v >= 0x10000ull && v < (1ull << 57); }

/* ------------------------------------------------------------------ */
/* Launch recording                                                    */

typedef struct {
  const char *api;
  CUfunction f;
  unsigned grid[3], block[3], smem;
  CUstream stream;
  void **kernelParams;
  void **extra;
  const CUlaunchConfig *config; /* Ex only */
  int cooperative_api;
} launch_t;

static void append_attrs(sbuf *b, const launch_t *L) {
  if (L->config) {
    const CUlaunchConfig *c = L->config;
    int coop = 0, have_cluster = 0;
    unsigned cl[3] = {0, 0, 0};
    sbuf rest = {0};
    for (unsigned i = 0; c->attrs && i < c->numAttrs; ++i) {
      const CUlaunchAttribute *a = &c->attrs[i];
      int iv;
      memcpy(&iv, &a->value, sizeof iv);
      switch ((int)a->id) {
        case CU_LAUNCH_ATTRIBUTE_IGNORE: break;
        case CU_LAUNCH_ATTRIBUTE_COOPERATIVE: coop = a->value.cooperative != 0; break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION:
          have_cluster = 1;
          cl[0] = a->value.clusterDim.x;
          cl[1] = a->value.clusterDim.y;
          cl[2] = a->value.clusterDim.z;
          break;
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_CLUSTER_DIMENSION:
          sb_printf(&rest, ",\"preferred_cluster_dim\":[%u,%u,%u]", a->value.preferredClusterDim.x,
                    a->value.preferredClusterDim.y, a->value.preferredClusterDim.z);
          break;
        case CU_LAUNCH_ATTRIBUTE_CLUSTER_SCHEDULING_POLICY_PREFERENCE:
          sb_printf(&rest, ",\"cluster_scheduling_policy\":%d", iv);
          break;
        case CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
          sb_printf(&rest, ",\"programmatic_stream_serialization\":%d", iv);
          break;
        case CU_LAUNCH_ATTRIBUTE_PRIORITY: sb_printf(&rest, ",\"priority\":%d", iv); break;
        case CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN: sb_printf(&rest, ",\"mem_sync_domain\":%d", iv); break;
        case CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
          sb_printf(&rest, ",\"preferred_shared_memory_carveout\":%d", iv);
          break;
        default:
          sb_printf(&rest, ",\"attr_%d\":\"", (int)a->id);
          sb_hex(&rest, &a->value, 16);
          sb_puts(&rest, "\"");
          break;
      }
    }
    if (have_cluster)
      sb_printf(b, "{\"cluster_dim\":[%u,%u,%u]", cl[0], cl[1], cl[2]);
    else
      sb_puts(b, "{\"cluster_dim\":null");
    sb_printf(b, ",\"cooperative\":%s,\"num_attrs\":%u", coop ? "true" : "false", c->numAttrs);
    if (rest.n) sb_putn(b, rest.p, rest.n);
    free(rest.p);
    sb_puts(b, "}");
  } else if (L->cooperative_api) {
    sb_puts(b, "{\"cluster_dim\":null,\"cooperative\":true}");
  } else {
    sb_puts(b, "null");
  }
}

/* The packed buffer of an `extra` array, if any. */
static int extra_buffer(void **extra, const void **ptr, size_t *size) {
  *ptr = NULL;
  *size = 0;
  if (!extra) return 0;
  for (int i = 0; i < 64 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
    if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) *ptr = extra[i + 1];
    else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1]) *size = *(size_t *)extra[i + 1];
  }
  return 1;
}

static void record_launch(const CUpti_CallbackData *cb, const launch_t *L, uint64_t t0) {
  CUresult result = CUDA_SUCCESS;
  if (cb->functionReturnValue) memcpy(&result, cb->functionReturnValue, sizeof result);

  /* 1. function info (driver calls outside the lock) */
  pthread_mutex_lock(&g_lock);
  func_t *f = func_lookup_locked(L->f);
  if (f && f->gen != g_gen) f = NULL;
  uint64_t gen = g_gen;
  pthread_mutex_unlock(&g_lock);
  if (!f) {
    f = func_compute(L->f, cb->symbolName);
    f->gen = gen;
    pthread_mutex_lock(&g_lock);
    func_insert_locked(f);
    pthread_mutex_unlock(&g_lock);
  }

  /* 2. parameter values and their classification */
  const void *xptr = NULL;
  size_t xsize = 0;
  int use_extra = extra_buffer(L->extra, &xptr, &xsize) && xptr && !L->kernelParams;
  int nparams = (L->kernelParams && !use_extra) ? f->nparams : -1;
  const char *reason = NULL;
  char reason_buf[320];
  if (use_extra) {
    if (xsize && xsize <= EXTRA_HEX_MAX)
      reason = "parameters passed through the packed extra buffer (CU_LAUNCH_PARAM_BUFFER_POINTER); "
               "raw bytes in extra_hex: LaunchRecord.params_from_extra(layout) cuts them";
    else {
      snprintf(reason_buf, sizeof reason_buf,
               "parameters passed through the packed extra buffer (CU_LAUNCH_PARAM_BUFFER_POINTER); "
               "its %zu bytes are not recorded (extra_hex keeps 1..%d)", xsize, EXTRA_HEX_MAX);
      reason = reason_buf;
    }
  } else if (!L->kernelParams) {
    reason = f->nparams == 0 ? NULL : "kernelParams is NULL";
    if (f->nparams == 0) nparams = 0;
  } else if (f->nparams < 0) {
    snprintf(reason_buf, sizeof reason_buf, "parameter layout unavailable: %s",
             f->param_err ? f->param_err : "unknown");
    reason = reason_buf;
  }

  uint64_t *vals = NULL;
  range_t *allocs = NULL;
  unsigned char *is_dev = NULL, *is_host = NULL;
  if (nparams > 0) {
    vals = (uint64_t *)calloc(nparams, sizeof *vals);
    allocs = (range_t *)calloc(nparams, sizeof *allocs);
    is_dev = (unsigned char *)calloc(nparams, 1);
    is_host = (unsigned char *)calloc(nparams, 1);
    for (int i = 0; i < nparams; ++i) {
      if (f->sizes[i] != 8 || !L->kernelParams[i]) continue;
      memcpy(&vals[i], L->kernelParams[i], 8);
      uint64_t v = vals[i];
      if (!plausible_pointer(v)) continue;
      pthread_mutex_lock(&g_lock);
      int hit = range_find_locked(v, &allocs[i]);
      pthread_mutex_unlock(&g_lock);
      if (hit) {
        is_dev[i] = 1;
        continue;
      }
      CUdeviceptr base = 0;
      size_t size = 0;
      if (drv.MemGetAddressRange && drv.MemGetAddressRange(&base, &size, (CUdeviceptr)v) == CUDA_SUCCESS && size) {
        allocs[i].base = base;
        allocs[i].size = size;
        is_dev[i] = 1;
        pthread_mutex_lock(&g_lock);
        range_insert_locked(allocs[i]);
        pthread_mutex_unlock(&g_lock);
        continue;
      }
      pthread_mutex_lock(&g_lock);
      int host = in_maps_locked(v);
      if (!host && now_ns() - g_maps_time > 20000000ull) {
        maps_refresh_locked();
        host = in_maps_locked(v);
      }
      pthread_mutex_unlock(&g_lock);
      is_host[i] = (unsigned char)host;
    }
  }

  /* 3. module id: handle from cuFuncGetModule (computed once per function) */
  CUmodule handle = f->module;
  if (!handle && f->fn && drv.FuncGetModule) {
    CUmodule m = NULL;
    if (drv.FuncGetModule(&m, f->fn) == CUDA_SUCCESS) handle = m;
  }

  /* 4. format and write (under the lock, so seq order is file order) */
  sbuf b = {0};
  sb_reserve(&b, 1024);
  pthread_mutex_lock(&g_lock);
  int64_t module_id = f->module_id;
  if (module_id < 0 && (f->module_try != g_nmodules || t_npending > 0)) {
    module_id = resolve_module_locked(handle, f->symbol[0] ? f->symbol : NULL);
    f->module_id = module_id;
    f->module_try = g_nmodules;
  }
  uint64_t seq = g_seq++;
  if (!t_tid) t_tid = (long)syscall(SYS_gettid);
  sb_printf(&b, "{\"seq\":%llu,\"t_ns\":%llu,\"pid\":%d,\"tid\":%ld,\"ctx\":%llu,\"stream\":%llu,",
            (unsigned long long)seq, (unsigned long long)t0, g_pid, t_tid,
            (unsigned long long)(uintptr_t)cb->context, (unsigned long long)(uintptr_t)L->stream);
  if (module_id >= 0) sb_printf(&b, "\"module_id\":%lld,", (long long)module_id);
  else sb_puts(&b, "\"module_id\":null,");
  sb_puts(&b, "\"symbol\":");
  sb_json_str(&b, f->symbol);
  sb_printf(&b, ",\"api\":\"%s\",\"grid\":[%u,%u,%u],\"block\":[%u,%u,%u],\"shared_mem\":%u,\"attrs\":", L->api,
            L->grid[0], L->grid[1], L->grid[2], L->block[0], L->block[1], L->block[2], L->smem);
  append_attrs(&b, L);
  sb_puts(&b, ",\"params\":");
  if (nparams < 0) {
    sb_puts(&b, "null");
  } else {
    sb_puts(&b, "[");
    for (int i = 0; i < nparams; ++i) {
      if (i) sb_puts(&b, ",");
      sb_printf(&b, "{\"offset\":%zu,\"size\":%zu,\"hex\":\"", f->offsets[i], f->sizes[i]);
      if (L->kernelParams[i]) sb_hex(&b, L->kernelParams[i], f->sizes[i]);
      sb_puts(&b, "\",\"alloc\":");
      if (is_dev[i])
        sb_printf(&b, "{\"base\":%llu,\"size\":%llu}", (unsigned long long)allocs[i].base,
                  (unsigned long long)allocs[i].size);
      else
        sb_puts(&b, "null");
      sb_printf(&b, ",\"host\":%s}", is_host[i] ? "true" : "false");
    }
    sb_puts(&b, "]");
  }
  sb_puts(&b, ",\"params_reason\":");
  if (reason) sb_json_str(&b, reason);
  else sb_puts(&b, "null");
  sb_printf(&b, ",\"result\":%d", (int)result);
  if (f->num_regs >= 0) sb_printf(&b, ",\"num_regs\":%d", f->num_regs);
  if (f->static_smem >= 0) sb_printf(&b, ",\"static_shared_mem\":%d", f->static_smem);
  if (use_extra && xsize && xsize <= EXTRA_HEX_MAX) {
    sb_puts(&b, ",\"extra_hex\":\"");
    sb_hex(&b, xptr, xsize);
    sb_puts(&b, "\"");
  }
  sb_printf(&b, ",\"func\":%llu}\n", (unsigned long long)(uintptr_t)L->f);
  emit_launch_locked(b.p, b.n);
  pthread_mutex_unlock(&g_lock);
  free(b.p);
  free(vals);
  free(allocs);
  free(is_dev);
  free(is_host);
}

/* ------------------------------------------------------------------ */
/* Callback                                                            */

static int is_launch_cbid(CUpti_CallbackId id) {
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: return 1;
    default: return 0;
  }
}

static void fill_launch(CUpti_CallbackId id, const void *params, launch_t *L) {
  memset(L, 0, sizeof *L);
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz: {
      const cuLaunchKernel_params *p = (const cuLaunchKernel_params *)params;
      L->api = id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel ? "cuLaunchKernel" : "cuLaunchKernel_ptsz";
      L->f = p->f;
      L->grid[0] = p->gridDimX, L->grid[1] = p->gridDimY, L->grid[2] = p->gridDimZ;
      L->block[0] = p->blockDimX, L->block[1] = p->blockDimY, L->block[2] = p->blockDimZ;
      L->smem = p->sharedMemBytes;
      L->stream = p->hStream;
      L->kernelParams = p->kernelParams;
      L->extra = p->extra;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz: {
      const cuLaunchKernelEx_params *p = (const cuLaunchKernelEx_params *)params;
      const CUlaunchConfig *c = p->config;
      L->api = id == CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx ? "cuLaunchKernelEx" : "cuLaunchKernelEx_ptsz";
      L->f = p->f;
      if (c) {
        L->grid[0] = c->gridDimX, L->grid[1] = c->gridDimY, L->grid[2] = c->gridDimZ;
        L->block[0] = c->blockDimX, L->block[1] = c->blockDimY, L->block[2] = c->blockDimZ;
        L->smem = c->sharedMemBytes;
        L->stream = c->hStream;
      }
      L->config = c;
      L->kernelParams = p->kernelParams;
      L->extra = p->extra;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel:
    case CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz: {
      const cuLaunchCooperativeKernel_params *p = (const cuLaunchCooperativeKernel_params *)params;
      L->api = id == CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel ? "cuLaunchCooperativeKernel"
                                                                       : "cuLaunchCooperativeKernel_ptsz";
      L->f = p->f;
      L->grid[0] = p->gridDimX, L->grid[1] = p->gridDimY, L->grid[2] = p->gridDimZ;
      L->block[0] = p->blockDimX, L->block[1] = p->blockDimY, L->block[2] = p->blockDimZ;
      L->smem = p->sharedMemBytes;
      L->stream = p->hStream;
      L->kernelParams = p->kernelParams;
      L->cooperative_api = 1;
      break;
    }
  }
}

/* After an API that may have loaded a module, bind the handle it returned. */
static void bind_after(CUpti_CallbackId id, const CUpti_CallbackData *cb) {
  CUresult result = CUDA_SUCCESS;
  if (cb->functionReturnValue) memcpy(&result, cb->functionReturnValue, sizeof result);
  if (result != CUDA_SUCCESS || t_npending == 0) return;
  CUmodule handle = NULL;
  const char *symbol = NULL;
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoad:
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData:
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx:
    case CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary: {
      /* all four start with `CUmodule *module` */
      CUmodule *pm = *(CUmodule *const *)cb->functionParams;
      if (pm) handle = *pm;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuLibraryGetModule: {
      const cuLibraryGetModule_params *p = (const cuLibraryGetModule_params *)cb->functionParams;
      if (p->pMod) handle = *p->pMod;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuModuleGetFunction: {
      const cuModuleGetFunction_params *p = (const cuModuleGetFunction_params *)cb->functionParams;
      handle = p->hmod;
      symbol = p->name;
      break;
    }
    case CUPTI_DRIVER_TRACE_CBID_cuKernelGetFunction: {
      const cuKernelGetFunction_params *p = (const cuKernelGetFunction_params *)cb->functionParams;
      if (p->pFunc && *p->pFunc && drv.FuncGetModule) {
        CUmodule m = NULL;
        const char *nm = NULL;
        t_in_cb = 1;
        if (drv.FuncGetModule(&m, *p->pFunc) == CUDA_SUCCESS) handle = m;
        if (drv.FuncGetName && drv.FuncGetName(&nm, *p->pFunc) == CUDA_SUCCESS) symbol = nm;
        t_in_cb = 0;
      }
      break;
    }
    default: return;
  }
  if (!handle) return;
  pthread_mutex_lock(&g_lock);
  resolve_module_locked(handle, symbol);
  pthread_mutex_unlock(&g_lock);
}

static void CUPTIAPI callback(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId id, const void *data) {
  (void)userdata;
  if (domain == CUPTI_CB_DOMAIN_RESOURCE) {
    const CUpti_ResourceData *rd = (const CUpti_ResourceData *)data;
    if (id == CUPTI_CBID_RESOURCE_MODULE_LOADED)
      on_module_loaded(rd->context, (const CUpti_ModuleResourceData *)rd->resourceDescriptor);
    else if (id == CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING)
      on_module_unload((const CUpti_ModuleResourceData *)rd->resourceDescriptor);
    return;
  }
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API || t_in_cb) return;
  const CUpti_CallbackData *cb = (const CUpti_CallbackData *)data;
  switch (id) {
    case CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync:
    case CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz:
    case CUPTI_DRIVER_TRACE_CBID_cuMemUnmap:
    case CUPTI_DRIVER_TRACE_CBID_cuMemRelease:
    case CUPTI_DRIVER_TRACE_CBID_cuMemAddressFree:
      if (cb->callbackSite == CUPTI_API_ENTER) {
        pthread_mutex_lock(&g_lock);
        g_nranges = 0;
        pthread_mutex_unlock(&g_lock);
      }
      return;
    default: break;
  }
  if (cb->callbackSite == CUPTI_API_ENTER) {
    t_tracking = 1;
    t_npending = 0;
    if (is_launch_cbid(id) && cb->correlationData) *cb->correlationData = now_ns();
    return;
  }
  /* CUPTI_API_EXIT */
  t_in_cb = 1;
  if (is_launch_cbid(id)) {
    launch_t L;
    fill_launch(id, cb->functionParams, &L);
    uint64_t t0 = cb->correlationData && *cb->correlationData ? *cb->correlationData : now_ns();
    record_launch(cb, &L, t0);
  } else {
    t_in_cb = 0;
    bind_after(id, cb);
  }
  t_in_cb = 0;
  t_tracking = 0;
  t_npending = 0;
}

/* ------------------------------------------------------------------ */
/* Setup                                                               */

static void at_exit(void) {
  pthread_mutex_lock(&g_lock);
  flush_locked();
  g_buffered = 0; /* anything after this (late destructors) is written directly */
  uint64_t n = g_seq, m = g_nmodules;
  pthread_mutex_unlock(&g_lock);
  if (!getenv("KERN_CAPTURE_QUIET") || !*getenv("KERN_CAPTURE_QUIET"))
    fprintf(stderr, "kern-capture: pid %d: %llu launches, %llu modules -> %s\n", g_pid, (unsigned long long)n,
            (unsigned long long)m, g_dir);
}

static void append_cmdline(sbuf *b) {
  sb_puts(b, "[");
  int fd = open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) {
      buf[n] = 0;
      int first = 1;
      for (char *p = buf; p < buf + n; p += strlen(p) + 1) {
        if (!first) sb_puts(b, ",");
        sb_json_str(b, p);
        first = 0;
      }
    }
  }
  sb_puts(b, "]");
}

static void write_error(const char *code, const char *message, int cupti_code) {
  sbuf b = {0};
  sb_puts(&b, "{\"error\":");
  sb_json_str(&b, code);
  sb_puts(&b, ",\"message\":");
  sb_json_str(&b, message);
  sb_printf(&b, ",\"pid\":%d,\"code\":%d}\n", g_pid, cupti_code);
  write_json_file(g_dir, "error.json", b.p);
  free(b.p);
  fprintf(stderr, "kern-capture: ERROR (pid %d): %s\n", g_pid, message);
}

static int open_outputs(void) {
  char path[4200];
  snprintf(path, sizeof path, "%s/launches.jsonl", g_dir);
  g_launch_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_TRUNC | O_CLOEXEC, 0644);
  snprintf(path, sizeof path, "%s/modules.jsonl", g_dir);
  g_module_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_TRUNC | O_CLOEXEC, 0644);
  return g_launch_fd < 0 || g_module_fd < 0 ? -1 : 0;
}

/* Take DIR for the first process of the command, DIR/pid<N> for others. */
static void choose_dir(void) {
  const char *out = getenv("KERN_CAPTURE_OUT");
  char base[3500];
  if (out && *out) snprintf(base, sizeof base, "%s", out);
  else snprintf(base, sizeof base, "kern-capture-%d", g_pid);
  mkdir_p(base);
  char claim[4000];
  snprintf(claim, sizeof claim, "%s/capture.json", base);
  int fd = open(claim, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    close(fd);
    snprintf(g_dir, sizeof g_dir, "%s", base);
  } else {
    snprintf(g_dir, sizeof g_dir, "%s/pid%d", base, g_pid);
    mkdir_p(g_dir);
  }
}

EXPORT int InitializeInjection(void) {
  static int done = 0;
  if (done) return 1;
  done = 1;
  g_pid = (int)getpid();
  const char *buffered = getenv("KERN_CAPTURE_BUFFERED");
  g_buffered = buffered && *buffered && strcmp(buffered, "0") != 0;
  choose_dir();
  int have_driver = load_driver();

  uint32_t cupti_version = 0;
  cuptiGetVersion(&cupti_version);
  const char *loading = getenv("CUDA_MODULE_LOADING");
  sbuf info = {0};
  sb_printf(&info, "{\"pid\":%d,\"version\":\"%s\",\"cuda_version\":%d,\"cupti_version\":%u,\"eager_modules\":%s,"
                   "\"buffered\":%s,\"t_ns\":%llu,\"cmdline\":",
            g_pid, KERN_CAPTURE_VERSION, CUDA_VERSION, cupti_version,
            loading && strcmp(loading, "EAGER") == 0 ? "true" : "false", g_buffered ? "true" : "false",
            (unsigned long long)now_ns());
  append_cmdline(&info);
  sb_puts(&info, "}\n");
  write_json_file(g_dir, "capture.json", info.p);
  free(info.p);

  if (!have_driver) {
    write_error("no_driver", "libcuda.so.1 is not loaded in this process and cannot be opened (no NVIDIA driver?); "
                "nothing captured", 0);
    return 1;
  }
  if (!drv.FuncGetParamInfo || !drv.FuncGetName || !drv.MemGetAddressRange) {
    write_error("driver_too_old",
                "the CUDA driver lacks cuFuncGetParamInfo/cuFuncGetName (needs CUDA 12.4 or newer); "
                "nothing captured",
                0);
    return 1;
  }

  CUptiResult r;
#ifdef CUpti_SubscriberParams_STRUCT_SIZE
  char old[256] = {0};
  CUpti_SubscriberParams sp;
  memset(&sp, 0, sizeof sp);
  sp.structSize = CUpti_SubscriberParams_STRUCT_SIZE;
  sp.subscriberName = "kern-capture";
  sp.oldSubscriberName = old;
  sp.oldSubscriberSize = sizeof old;
  r = cuptiSubscribe_v2(&g_sub, (CUpti_CallbackFunc)callback, NULL, &sp);
#else
  const char *old = "";
  r = cuptiSubscribe(&g_sub, (CUpti_CallbackFunc)callback, NULL);
#endif
  if (r != CUPTI_SUCCESS) {
    const char *s = NULL;
    cuptiGetResultString(r, &s);
    char msg[1024];
    if (r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
      snprintf(msg, sizeof msg,
               "CUPTI already has a subscriber in this process%s%s%s (a profiler or debugger such as nsys, ncu, "
               "cuda-gdb or compute-sanitizer holds it); CUPTI allows one, so kern-capture cannot capture. "
               "Run the command without the other tool.",
               old[0] ? " (" : "", old, old[0] ? ")" : "");
    else
      snprintf(msg, sizeof msg, "cuptiSubscribe failed: %s", s ? s : "unknown CUPTI error");
    write_error(r == CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED ? "multiple_subscribers" : "cupti_subscribe",
                msg, (int)r);
    return 1;
  }

  if (open_outputs() != 0) {
    char msg[4400];
    snprintf(msg, sizeof msg, "cannot write to %s: %s", g_dir, strerror(errno));
    write_error("output", msg, 0);
    cuptiUnsubscribe(g_sub);
    return 1;
  }
  g_last_flush = now_ns();

  static const CUpti_CallbackId driver_ids[] = {
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel,
      CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz,
      /* module handle binding */
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoad,
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData,
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoadDataEx,
      CUPTI_DRIVER_TRACE_CBID_cuModuleLoadFatBinary,
      CUPTI_DRIVER_TRACE_CBID_cuModuleGetFunction,
      CUPTI_DRIVER_TRACE_CBID_cuLibraryGetModule,
      CUPTI_DRIVER_TRACE_CBID_cuKernelGetFunction,
      /* device range cache invalidation */
      CUPTI_DRIVER_TRACE_CBID_cuMemFree_v2,
      CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync,
      CUPTI_DRIVER_TRACE_CBID_cuMemFreeAsync_ptsz,
      CUPTI_DRIVER_TRACE_CBID_cuMemUnmap,
      CUPTI_DRIVER_TRACE_CBID_cuMemRelease,
      CUPTI_DRIVER_TRACE_CBID_cuMemAddressFree,
  };
  pthread_mutex_lock(&g_lock);
  g_active = 1;
  pthread_mutex_unlock(&g_lock);
  for (size_t i = 0; i < sizeof driver_ids / sizeof driver_ids[0]; ++i)
    cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_DRIVER_API, driver_ids[i]);
  cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED);
  cuptiEnableCallback(1, g_sub, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_UNLOAD_STARTING);
  atexit(at_exit);
  const char *quiet = getenv("KERN_CAPTURE_QUIET");
  if (!quiet || !*quiet)
    fprintf(stderr, "kern-capture %s: capturing pid %d into %s\n", KERN_CAPTURE_VERSION, g_pid, g_dir);
  return 1;
}

#ifdef KERN_CAPTURE_SELFTEST
/* ------------------------------------------------------------------ */
/* CPU self-test: drives the callback with a scripted sequence of CUPTI
 * events and stub driver functions, so the record format, the module-id
 * binding and the pointer classification are tested without a GPU.
 * Built only by the test suite (-DKERN_CAPTURE_SELFTEST).               */

#define ST_FN_A ((CUfunction)(uintptr_t)0x1000)  /* vec_add, module handle H1 */
#define ST_FN_B ((CUfunction)(uintptr_t)0x2000)  /* add_kernel, handle H2 */
#define ST_FN_C ((CUfunction)(uintptr_t)0x3000)  /* vec_add, handle H3 */
#define ST_FN_X ((CUfunction)(uintptr_t)0x4000)  /* unknown to the driver */
#define ST_H1 ((CUmodule)(uintptr_t)0x51000)
#define ST_H2 ((CUmodule)(uintptr_t)0x52000)
#define ST_H3 ((CUmodule)(uintptr_t)0x53000)
#define ST_DEV_BASE 0x7e0000000000ull
#define ST_DEV_SIZE 0x200000ull

static CUresult st_name(const char **n, CUfunction f) {
  if (f == ST_FN_A || f == ST_FN_C) *n = "vec_add";
  else if (f == ST_FN_B) *n = "add_kernel";
  else return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}
static CUresult st_module(CUmodule *m, CUfunction f) {
  if (f == ST_FN_A) *m = ST_H1;
  else if (f == ST_FN_B) *m = ST_H2;
  else if (f == ST_FN_C) *m = ST_H3;
  else return CUDA_ERROR_INVALID_HANDLE;
  return CUDA_SUCCESS;
}
static CUresult st_param(CUfunction f, size_t i, size_t *o, size_t *s) {
  static const size_t va[][2] = {{0, 8}, {8, 8}, {16, 8}, {24, 4}};
  static const size_t ak[][2] = {{0, 8}, {8, 8}, {16, 8}, {24, 4}, {32, 8}, {40, 8}};
  const size_t(*t)[2];
  size_t n;
  if (f == ST_FN_A || f == ST_FN_C) t = va, n = 4;
  else if (f == ST_FN_B) t = ak, n = 6;
  else return CUDA_ERROR_INVALID_HANDLE;
  if (i >= n) return CUDA_ERROR_INVALID_VALUE;
  *o = t[i][0];
  *s = t[i][1];
  return CUDA_SUCCESS;
}
static CUresult st_attr(int *v, CUfunction_attribute a, CUfunction f) {
  if (f == ST_FN_X) return CUDA_ERROR_INVALID_HANDLE;
  *v = a == CU_FUNC_ATTRIBUTE_NUM_REGS ? 32 : 0;
  return CUDA_SUCCESS;
}
static CUresult st_range(CUdeviceptr *b, size_t *s, CUdeviceptr v) {
  if (v >= ST_DEV_BASE && v < ST_DEV_BASE + ST_DEV_SIZE) {
    *b = ST_DEV_BASE;
    *s = ST_DEV_SIZE;
    return CUDA_SUCCESS;
  }
  return CUDA_ERROR_NOT_FOUND;
}

static void st_api(CUpti_CallbackId id, const void *params, const char *symbol, CUresult ret) {
  uint64_t corr = 0;
  CUpti_CallbackData cb;
  memset(&cb, 0, sizeof cb);
  cb.context = (CUcontext)(uintptr_t)0xC0;
  cb.functionParams = params;
  cb.functionReturnValue = &ret;
  cb.correlationData = &corr;
  cb.symbolName = symbol;
  cb.callbackSite = CUPTI_API_ENTER;
  callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, id, &cb);
  cb.callbackSite = CUPTI_API_EXIT;
  callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, id, &cb);
}

static void st_module_loaded(uint32_t id, const void *img, size_t size) {
  CUpti_ModuleResourceData md = {id, size, (const char *)img};
  CUpti_ResourceData rd;
  memset(&rd, 0, sizeof rd);
  rd.context = (CUcontext)(uintptr_t)0xC0;
  rd.resourceDescriptor = &md;
  callback(NULL, CUPTI_CB_DOMAIN_RESOURCE, CUPTI_CBID_RESOURCE_MODULE_LOADED, &rd);
}

/* Loads the vec_add cubin as module 5 (through cuModuleLoadData: handle
 * binding), the add_kernel cubin as module 6 and the vec_add cubin again as
 * module 7 (both outside any API call: resolved by symbol), then launches. */
EXPORT int kern_capture_selftest(const char *dir, const void *cubin_a, size_t size_a, const void *cubin_b,
                                 size_t size_b) {
  g_pid = (int)getpid();
  snprintf(g_dir, sizeof g_dir, "%s", dir);
  mkdir_p(g_dir);
  if (open_outputs() != 0) return -1;
  memset(&drv, 0, sizeof drv);
  drv.FuncGetName = st_name;
  drv.FuncGetModule = st_module;
  drv.FuncGetParamInfo = st_param;
  drv.FuncGetAttribute = st_attr;
  drv.MemGetAddressRange = st_range;
  g_active = 1;

  /* module 5 via cuModuleLoadData */
  CUmodule mod = NULL;
  cuModuleLoadData_params lp = {&mod, cubin_a};
  {
    uint64_t corr = 0;
    CUresult ok = CUDA_SUCCESS;
    CUpti_CallbackData cb;
    memset(&cb, 0, sizeof cb);
    cb.functionParams = &lp;
    cb.functionReturnValue = &ok;
    cb.correlationData = &corr;
    cb.callbackSite = CUPTI_API_ENTER;
    callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData, &cb);
    st_module_loaded(5, cubin_a, size_a);
    mod = ST_H1;
    cb.callbackSite = CUPTI_API_EXIT;
    callback(NULL, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuModuleLoadData, &cb);
  }
  st_module_loaded(6, cubin_b, size_b);
  st_module_loaded(7, cubin_a, size_a);

  uint64_t p0 = ST_DEV_BASE + 16, p1 = ST_DEV_BASE + 4096, zero = 0;
  static uint64_t host_var = 42;
  uint64_t p2 = (uint64_t)(uintptr_t)&host_var;
  int32_t n = 1024, neg = -7;

  /* 0: cuLaunchKernel, flat: device, device, host pointer, int */
  void *args_a[] = {&p0, &p1, &p2, &n};
  cuLaunchKernel_params k0 = {ST_FN_A, 4, 1, 1, 256, 1, 1, 0, (CUstream)(uintptr_t)0x77, args_a, NULL};
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &k0, "vec_add", CUDA_SUCCESS);

  /* 1: cuLaunchKernelEx with cluster dims and priority (Triton-like, 2 hidden params) */
  void *args_b[] = {&p0, &p1, &p0, &neg, &zero, &zero};
  CUlaunchAttribute at[2];
  memset(at, 0, sizeof at);
  at[0].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
  at[0].value.clusterDim.x = 2, at[0].value.clusterDim.y = 1, at[0].value.clusterDim.z = 1;
  at[1].id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
  at[1].value.priority = 3;
  CUlaunchConfig cfg = {8, 2, 1, 128, 1, 1, 1024, (CUstream)0, at, 2};
  cuLaunchKernelEx_params k1 = {&cfg, ST_FN_B, args_b, NULL};
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernelEx, &k1, "add_kernel", CUDA_SUCCESS);

  /* 2: packed extra buffer */
  unsigned char packed[28];
  memcpy(packed, &p0, 8), memcpy(packed + 8, &p1, 8), memcpy(packed + 16, &p0, 8), memcpy(packed + 24, &n, 4);
  size_t packed_size = sizeof packed;
  void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE, &packed_size,
                   CU_LAUNCH_PARAM_END};
  cuLaunchKernel_params k2 = {ST_FN_A, 1, 1, 1, 32, 1, 1, 0, (CUstream)0, NULL, extra};
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel_ptsz, &k2, "vec_add", CUDA_SUCCESS);

  /* 3: cooperative launch of the second vec_add instance (module 7) */
  void *args_c[] = {&p1, &p1, &p1, &n};
  cuLaunchCooperativeKernel_params k3 = {ST_FN_C, 2, 1, 1, 64, 1, 1, 0, (CUstream)(uintptr_t)2, args_c};
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchCooperativeKernel_ptsz, &k3, "vec_add", CUDA_SUCCESS);

  /* 4: a function the driver does not know; a failing launch; a name to escape */
  void *args_x[] = {&p0};
  cuLaunchKernel_params k4 = {ST_FN_X, 1, 1, 1, 1, 1, 1, 0, (CUstream)0, args_x, NULL};
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &k4, "odd\"name\\x", CUDA_ERROR_INVALID_HANDLE);

  /* 5: the first function again (cached path) */
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &k0, "vec_add", CUDA_SUCCESS);

  /* 6: a packed extra buffer over EXTRA_HEX_MAX: not recorded, the reason says so */
  static unsigned char big[EXTRA_HEX_MAX + 8];
  size_t big_size = sizeof big;
  void *extra_big[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, big, CU_LAUNCH_PARAM_BUFFER_SIZE, &big_size,
                       CU_LAUNCH_PARAM_END};
  cuLaunchKernel_params k6 = {ST_FN_A, 1, 1, 1, 32, 1, 1, 0, (CUstream)0, NULL, extra_big};
  st_api(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, &k6, "vec_add", CUDA_SUCCESS);

  pthread_mutex_lock(&g_lock);
  flush_locked();
  pthread_mutex_unlock(&g_lock);
  close(g_launch_fd);
  close(g_module_fd);
  g_launch_fd = g_module_fd = -1;
  return (int)g_seq;
}
#endif
