/* placeholder until its owner lands it */
/* (linked into shardctl) */
int sf_gen_placeholder;
