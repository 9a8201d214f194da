set terminal pngcairo size 1800,1320 font 'sans,9' noenhanced
set output 'matrix_reid.png'
set multiplot layout 4,5 title 'cold mass recalled (x) against re-ID (y), R = 30 % of W: kvmem with attention only, default (both channels), identity only; the mean-query client; the references'
set yrange [-0.05:1.1]
set grid
set offsets 0.02,0.02,0,0
names = 'attention default identity mean-query exact oracle'
set title 'base'
set key bottom left font 'sans,8'
plot for [k=0:5] 'matrix_reid.dat' index 0 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'sharp_diffuse_heads'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 1 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'head_subspaces'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 2 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'lookalikes'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 3 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'gqa_4x32'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 4 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'gqa_8x128'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 5 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'rope_1e4'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 6 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'rope_5e5'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 7 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'frame_24'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 8 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'frame_128'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 9 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'gaps_uniform'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 10 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'gaps_pareto'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 11 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'query_sharp'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 12 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'query_soft'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 13 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'peaked_tokens'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 14 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'whole_frame'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 15 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'lookalike_attention'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 16 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'whole_frame_128'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 17 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
set title 'all_at_once'
unset key
plot for [k=0:5] 'matrix_reid.dat' index 18 every ::k::k using 2:3 with points pt (k+4) ps 1.6 lw 2 title word(names, k+1)
unset multiplot
