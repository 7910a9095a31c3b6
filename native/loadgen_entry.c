/* Resolves mlperf::c::QuerySamplesComplete from the symbol table of the loaded mlperf_loadgen module.
 * See loadgen_entry.h for why; every step refuses (with a reason) rather than guessing. */
#define _GNU_SOURCE
#include "loadgen_entry.h"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* mlperf::c::QuerySamplesComplete(mlperf::QuerySampleResponse*, unsigned long) */
static const char k_symbol[] = "_ZN6mlperf1c20QuerySamplesCompleteEPNS_19QuerySampleResponseEm";

/* How many leading code bytes must match between memory and file: enough to identify the function. */
enum { k_compare_bytes = 64 };

static int fail(char *why, size_t why_len, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    vsnprintf(why, why_len, format, args);
    va_end(args);
    return -1;
}

/* True when [offset, offset + length) lies inside a file of `size` bytes, without overflow. */
static int in_file(uint64_t offset, uint64_t length, uint64_t size)
{
    return offset <= size && length <= size - offset;
}

static int find_symbol(const unsigned char *image, uint64_t size, const char *wanted, const ElfW(Sym) **found,
                       const ElfW(Shdr) **found_section, char *why, size_t why_len)
{
    if (size < sizeof(ElfW(Ehdr)))
        return fail(why, why_len, "file too small for an ELF header");
    const ElfW(Ehdr) *header = (const ElfW(Ehdr) *)image;
    if (memcmp(header->e_ident, ELFMAG, SELFMAG) != 0)
        return fail(why, why_len, "not an ELF file");
    if (header->e_ident[EI_CLASS] != (sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32))
        return fail(why, why_len, "ELF class differs from this process");
    if (header->e_shentsize != sizeof(ElfW(Shdr)) ||
        !in_file(header->e_shoff, (uint64_t)header->e_shnum * sizeof(ElfW(Shdr)), size))
        return fail(why, why_len, "section headers out of range");
    const ElfW(Shdr) *sections = (const ElfW(Shdr) *)(image + header->e_shoff);

    for (unsigned s = 0; s < header->e_shnum; s++) {
        const ElfW(Shdr) *table = &sections[s];
        if (table->sh_type != SHT_SYMTAB)
            continue;
        if (table->sh_link >= header->e_shnum || table->sh_entsize != sizeof(ElfW(Sym)) ||
            !in_file(table->sh_offset, table->sh_size, size))
            return fail(why, why_len, "symbol table out of range");
        const ElfW(Shdr) *strings = &sections[table->sh_link];
        if (!in_file(strings->sh_offset, strings->sh_size, size))
            return fail(why, why_len, "string table out of range");
        const char *names = (const char *)(image + strings->sh_offset);
        const ElfW(Sym) *symbols = (const ElfW(Sym) *)(image + table->sh_offset);
        size_t count = table->sh_size / sizeof(ElfW(Sym));
        for (size_t i = 0; i < count; i++) {
            const ElfW(Sym) *symbol = &symbols[i];
            if (ELF64_ST_TYPE(symbol->st_info) != STT_FUNC || symbol->st_name >= strings->sh_size)
                continue;
            /* Bounded compare: the name must end inside the string table. */
            size_t room = strings->sh_size - symbol->st_name;
            size_t wanted_size = strlen(wanted) + 1;
            if (room < wanted_size || memcmp(names + symbol->st_name, wanted, wanted_size) != 0)
                continue;
            if (symbol->st_shndx == SHN_UNDEF || symbol->st_shndx >= header->e_shnum)
                return fail(why, why_len, "%s is not defined in a section", wanted);
            *found = symbol;
            *found_section = &sections[symbol->st_shndx];
            return 0;
        }
    }
    return fail(why, why_len, "%s not in the symbol table (stripped module?)", wanted);
}

int lg_entry_resolve(const void *address_in_module, lg_complete_fn *fn, char *why, size_t why_len)
{
    void *found = NULL;
    if (lg_symbol_resolve(address_in_module, k_symbol, &found, why, why_len) != 0)
        return -1;
    memcpy(fn, &found, sizeof(*fn)); /* POSIX: object and function pointers share a size */
    return 0;
}

int lg_symbol_resolve(const void *address_in_module, const char *wanted, void **out, char *why, size_t why_len)
{
    Dl_info info;
    struct link_map *map = NULL;
    if (!dladdr1(address_in_module, &info, (void **)&map, RTLD_DL_LINKMAP) || map == NULL ||
        info.dli_fname == NULL || info.dli_fname[0] == '\0')
        return fail(why, why_len, "cannot tell which shared object holds mlperf_loadgen");

    int fd = open(info.dli_fname, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(why, why_len, "cannot open %s", info.dli_fname);
    struct stat status;
    if (fstat(fd, &status) != 0 || status.st_size <= 0) {
        close(fd);
        return fail(why, why_len, "cannot stat %s", info.dli_fname);
    }
    uint64_t size = (uint64_t)status.st_size;
    void *mapped = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (mapped == MAP_FAILED)
        return fail(why, why_len, "cannot map %s", info.dli_fname);

    const ElfW(Sym) *symbol = NULL;
    const ElfW(Shdr) *section = NULL;
    int status_code = find_symbol(mapped, size, wanted, &symbol, &section, why, why_len);
    if (status_code == 0) {
        uint64_t compare = symbol->st_size < k_compare_bytes ? symbol->st_size : k_compare_bytes;
        if (section->sh_type != SHT_PROGBITS || !(section->sh_flags & SHF_EXECINSTR) || compare == 0 ||
            symbol->st_value < section->sh_addr || symbol->st_value - section->sh_addr > section->sh_size ||
            section->sh_size - (symbol->st_value - section->sh_addr) < compare ||
            !in_file(section->sh_offset + (symbol->st_value - section->sh_addr), compare, size)) {
            status_code = fail(why, why_len, "%s has an unexpected location", wanted);
        } else {
            const unsigned char *in_memory = (const unsigned char *)(map->l_addr + symbol->st_value);
            const unsigned char *on_disk =
                (const unsigned char *)mapped + section->sh_offset + (symbol->st_value - section->sh_addr);
            /* Same bytes at the computed address: the file describes the object that is mapped. */
            if (memcmp(in_memory, on_disk, compare) != 0) {
                status_code = fail(why, why_len, "%s: code in memory differs from the file", info.dli_fname);
            } else {
                *out = (void *)in_memory;
            }
        }
    }
    munmap(mapped, size);
    return status_code;
}
