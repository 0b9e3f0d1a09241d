/*
 * schema_keys: prints the schedule's key table (core/mf_schema.h), one key a
 * line, "section<TAB>key<TAB>type<TAB>presence<TAB>since", in the table's
 * order, for check_schema.py to hold docs/schedule.md §2.5 to it.
 */
#include <stdio.h>

#include "mf_schema.h"

int main(void)
{
    for (int s = 0; s < MF_SECTION_COUNT; s++) {
        const mf_schema_section *sec = &mf_schema_sections[s];
        for (int k = 0; k < sec->nkeys; k++) {
            const mf_schema_key *key = &sec->keys[k];
            printf("%s\t%s\t%s\t%s\t%d\n", sec->path, key->name, mf_schema_type_name(key->type),
                   mf_schema_presence_name(key->presence), key->since);
        }
    }
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}
