/* Bind the glibc symbols that moved into libc in 2.34 to their old versions, so that the library
 * loads on the older glibc of a training image built elsewhere (x86-64: GLIBC_2.2.5; the newest
 * version the library then needs is GLIBC_2.17, tests/unit/nccl/test_abi_layout.py). Included by
 * every translation unit of the plugin, after the system headers (.symver renames a declared
 * symbol). */
#ifndef MYCROFT_GLIBC_COMPAT_H
#define MYCROFT_GLIBC_COMPAT_H

#if defined(__x86_64__) && defined(__GLIBC__)
__asm__(".symver pthread_create,pthread_create@GLIBC_2.2.5");
__asm__(".symver pthread_atfork,pthread_atfork@GLIBC_2.2.5");
__asm__(".symver pthread_once,pthread_once@GLIBC_2.2.5");
__asm__(".symver dlopen,dlopen@GLIBC_2.2.5");
__asm__(".symver dlsym,dlsym@GLIBC_2.2.5");
#endif

#endif
